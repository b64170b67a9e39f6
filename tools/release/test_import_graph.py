"""The workspace's layering, read from the sources and the published metadata: no package imports
a package that depends on it, and the dependencies themselves run one way.

"Depends on" is what a user's installer sees: each package's ``dependencies`` and every extra's,
followed transitively. An import is any ``import``/``from ... import`` statement in the package's
``src/`` (read with ``ast``: function-level and ``TYPE_CHECKING`` imports count, a dynamic
``importlib.import_module`` does not: that is how the facade delegates to the engine packages).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from smg_it.paths import REPO

pytestmark = pytest.mark.unit

PACKAGES = sorted(p.parent for p in (REPO / "packages").glob("*/pyproject.toml"))
FACADE = "smg-grpc-servicer"
#: The one engine package in the facade's base dependencies (the seed's TokenSpeed line).
FACADE_BASE_ENGINE = "smg-servicer-tokenspeed"


def _project(root: Path) -> dict[str, Any]:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


def dependencies(root: Path, names: Iterable[str], *, extras: bool = True) -> set[str]:
    """The workspace packages ``root``'s package requires, by its base dependencies and (with
    ``extras``) every extra."""
    project = _project(root)
    reqs: list[str] = list(project.get("dependencies", []))
    if extras:
        for extra in project.get("optional-dependencies", {}).values():
            reqs += extra
    return {Requirement(r).name for r in reqs} & set(names)


def closure(direct: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Every package each one depends on, directly or through others."""
    found: dict[str, set[str]] = {}
    for name in direct:
        seen: set[str] = set()
        todo = list(direct[name])
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo += direct.get(dep, set())
        found[name] = seen
    return found


def imported_packages(src: Path) -> dict[str, set[str]]:
    """Top-level package name -> the files of ``src`` that import it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                found.setdefault(module.split(".")[0], set()).add(str(path.relative_to(src)))
    return found


def back_imports(
    depends: Mapping[str, set[str]],
    imports: Mapping[str, Mapping[str, set[str]]],
    dist_of: Mapping[str, str],
) -> list[str]:
    """Each import from a package into one that depends on it: ``a imports b (b depends on a)``."""
    arrows: list[str] = []
    for dist, by_module in sorted(imports.items()):
        for module, files in sorted(by_module.items()):
            target = dist_of.get(module)
            if target is None or target == dist:
                continue
            if dist in depends[target]:
                arrows.append(
                    f"{dist} imports {module} ({target} depends on {dist}): {sorted(files)}"
                )
    return arrows


def _import_names(root: Path) -> list[str]:
    return sorted(p.parent.name for p in (root / "src").glob("*/__init__.py"))


NAMES = [_project(root)["name"] for root in PACKAGES]
DIST_OF = {module: _project(root)["name"] for root in PACKAGES for module in _import_names(root)}


def test_every_workspace_package_is_in_the_graph() -> None:
    assert len(PACKAGES) == 8, PACKAGES
    assert sorted(set(DIST_OF.values())) == sorted(NAMES)  # each has an import package


def test_no_package_imports_a_package_that_depends_on_it() -> None:
    depends = closure({_project(r)["name"]: dependencies(r, NAMES) for r in PACKAGES})
    imports = {_project(r)["name"]: imported_packages(r / "src") for r in PACKAGES}
    assert back_imports(depends, imports, DIST_OF) == []


def test_the_dependencies_run_one_way() -> None:
    """No package depends on itself through others, extras included. The exceptions are the
    facade's engine extras (``pip install 'smg-grpc-servicer[vllm]'``, the seed's install lines)
    and its TokenSpeed servicer (the seed's TokenSpeed line is the bare ``pip install
    smg-grpc-servicer``), which bring engine packages that themselves require the facade (the
    engines' launchers import our servicers through the facade's paths); the facade imports none
    of them (the test above)."""
    direct = {
        _project(r)["name"]: dependencies(r, NAMES, extras=_project(r)["name"] != FACADE)
        for r in PACKAGES
    }
    assert direct[FACADE] == {"smg-servicer-core", FACADE_BASE_ENGINE}
    direct[FACADE] = direct[FACADE] - {FACADE_BASE_ENGINE}
    cycles = {name: deps for name, deps in closure(direct).items() if name in deps}
    assert cycles == {}


def test_the_check_finds_a_back_import_and_a_cycle() -> None:
    """The checks above on a made-up workspace: ``proto`` (leaf) <- ``engine``, and ``proto``
    importing ``engine`` back; a cycle through an extra."""
    depends = closure({"proto": set(), "engine": {"proto"}})
    imports = {"proto": {"engine_pkg": {"x.py"}}, "engine": {"proto_pkg": {"y.py"}}}
    dist_of = {"proto_pkg": "proto", "engine_pkg": "engine"}
    assert back_imports(depends, imports, dist_of) == [
        "proto imports engine_pkg (engine depends on proto): ['x.py']"
    ]
    looped = closure({"proto": {"engine"}, "engine": {"proto"}})
    assert "proto" in looped["proto"]


def test_the_sidecar_protocol_package_is_a_leaf() -> None:
    """smg-servicer-mm-sidecar (protocol, client, loops) needs msgspec and, for ``[redis]``, the
    Redis client: no workspace package, whatever the extra, and it imports none."""
    root = REPO / "packages" / "smg-servicer-mm-sidecar"
    assert dependencies(root, NAMES) == set()
    imported = set(imported_packages(root / "src")) & set(DIST_OF)
    assert imported == {"smg_servicer_mm_sidecar"}
    project = _project(root)
    assert sorted(project.get("optional-dependencies", {})) == ["redis"]

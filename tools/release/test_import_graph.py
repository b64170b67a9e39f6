"""The workspace's layering, read from the sources and the published metadata: no package imports
a package that depends on it, and the dependencies themselves run one way.

"Depends on" is what a user's installer sees: each package's ``dependencies`` and every extra's,
followed transitively. An import is any ``import``/``from ... import`` statement in the package's
``src/`` (read with ``ast``: function-level and ``TYPE_CHECKING`` imports count, a dynamic
``importlib.import_module`` does not: that is how the facade delegates to the engine packages).

Inside each package the modules import one another without a circle (issue #41): a function-level
import of a sibling module counts, so an import moved into a function to hide a circle is found.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


# Inside a package -------------------------------------------------------------------------------

#: The longest ``Generate`` of smg_servicer_vllm's servicer, ``def`` to its end (issue #41).
GENERATE_MAX_LINES = 40
VLLM_SRC = REPO / "packages" / "smg-servicer-vllm" / "src"


def package_modules(src: Path) -> dict[str, Path]:
    """Every module under ``src`` (a package's ``src/`` folder) by its dotted name; a package's
    ``__init__.py`` goes by the package's name."""
    found: dict[str, Path] = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _deepest(dotted: str, modules: Mapping[str, Path]) -> str | None:
    """The module of ``modules`` that ``dotted`` (``a.b.c``) loads last: itself or the nearest
    parent among them; None for a module outside them."""
    while dotted and dotted not in modules:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _targets(node: ast.Import | ast.ImportFrom, name: str, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` an import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the package that holds ``name`` (or is it), up
            parts = name.split(".") if modules[name].name == "__init__.py" else name.split(".")[:-1]
            base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [node.module])])
        # ``from a import b``: the module ``a.b``, else ``a`` (``b`` is a name in it)
        wanted = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    return {target for dotted in wanted if (target := _deepest(dotted, modules))} - {name}


def sibling_imports(src: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same ``src`` it imports: at module level, inside a function
    or under ``TYPE_CHECKING``. ``import a.b`` and ``from a import b`` (``b`` a module) name
    ``a.b``; ``from a import name`` names ``a``; relative imports are resolved. The parent
    packages Python imports first are not edges (they run before their children)."""
    modules = package_modules(src)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[name] |= _targets(node, name, modules)
    return graph


def import_circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import one another, directly or through others (sorted)."""
    reach = closure(graph)
    groups = {
        frozenset({name} | {other for other in reach[name] if name in reach[other]})
        for name in graph
        if name in reach[name]
    }
    return sorted(sorted(group) for group in groups)


@pytest.mark.parametrize("root", PACKAGES, ids=[root.name for root in PACKAGES])
def test_no_import_circle_inside_a_package(root: Path) -> None:
    assert import_circles(sibling_imports(root / "src")) == []


def test_the_check_finds_a_circle_inside_a_package(tmp_path: Path) -> None:
    """A made-up package with two circles: one hidden in a function (relative import), one
    through a subpackage; the subpackage's ``__init__`` importing its own module is none."""
    files = {
        "pkg/__init__.py": "",
        "pkg/x.py": "from pkg import y\n",
        "pkg/y.py": "def f():\n    from .x import g\n",
        "pkg/z.py": "import pkg.x\nfrom pkg.sub import w\n",
        "pkg/sub/__init__.py": "from . import w\n",
        "pkg/sub/w.py": "import os\n\nclass C:\n    def m(self):\n        from ..z import n\n",
        "pkg/leaf.py": "from pkg.sub.w import C\nfrom pkg import helper\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    graph = sibling_imports(tmp_path)
    assert graph == {
        "pkg": set(),
        "pkg.x": {"pkg.y"},
        "pkg.y": {"pkg.x"},
        "pkg.z": {"pkg.x", "pkg.sub.w"},
        "pkg.sub": {"pkg.sub.w"},
        "pkg.sub.w": {"pkg.z"},
        "pkg.leaf": {"pkg.sub.w", "pkg"},
    }
    assert import_circles(graph) == [["pkg.sub.w", "pkg.z"], ["pkg.x", "pkg.y"]]


def test_vllm_generate_is_short() -> None:
    path = VLLM_SRC / "smg_servicer_vllm" / "servicer.py"
    (generate,) = [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "Generate"
    ]
    assert generate.end_lineno is not None
    assert generate.end_lineno - generate.lineno + 1 <= GENERATE_MAX_LINES


def _function_level_imports(path: Path) -> list[int]:
    """The lines of the imports inside a function (or a method) of ``path``."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines += [
                child.lineno
                for child in ast.walk(node)
                if isinstance(child, ast.Import | ast.ImportFrom)
            ]
    return sorted(set(lines))


def test_vllm_function_level_imports_say_why() -> None:
    """smg_servicer_vllm imports at module top, except what importing the package must not load
    (vLLM, torch, transformers, PIL, zmq): each of those says why on its line
    (``# noqa: PLC0415 - <reason>``; ruff's PLC0415 flags the others, the test below)."""
    unexplained = [
        f"{path.relative_to(VLLM_SRC)}:{line}"
        for path in sorted(VLLM_SRC.rglob("*.py"))
        for line in _function_level_imports(path)
        if "# noqa: PLC0415 - " not in path.read_text().splitlines()[line - 1]
    ]
    assert unexplained == []


def test_ruff_flags_a_function_level_import_in_the_vllm_package() -> None:
    """The workspace's ruff settings (PLC0415, import-outside-top-level) apply to the package's
    sources: a function-level import there is an error unless it says ``noqa``."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "PLC0415",
         "--output-format", "concise", "--stdin-filename",
         str(VLLM_SRC / "smg_servicer_vllm" / "_made_up.py"), "-"],
        input="def f() -> None:\n    import json\n\n    json.dumps(1)\n",
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PLC0415" in result.stdout

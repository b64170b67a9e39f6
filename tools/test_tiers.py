"""The root conftest's collection check: a run that collects a test without a tier marker fails
before anything runs, naming each such test; tiered tests (module, class or function marks)
pass."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from smg_it.paths import REPO

pytestmark = pytest.mark.unit

TESTS = """
import pytest

pytestmark = pytest.mark.standin  # not a tier


@pytest.mark.unit
def test_unit(): pass


@pytest.mark.engine
@pytest.mark.parametrize("n", [1, 2])
def test_engine(n): pass


@pytest.mark.integration
class TestRouter:
    def test_inside(self): pass


def test_untiered(): pass


@pytest.mark.parametrize("n", [1])
def test_untiered_too(n): pass
"""


def collect(folder: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only`` of ``source`` under the root's conftest and markers."""
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = options["ini_options"]["markers"]
    (folder / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        f"pythonpath = [{str(REPO / 'tests-integration')!r}]\n"
        f"markers = {markers!r}\n"
        "addopts = '--strict-markers -p no:cacheprovider'\n"
    )
    shutil.copy(REPO / "conftest.py", folder / "conftest.py")
    (folder / "test_sample.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_an_untiered_test_fails_the_run_and_is_named(tmp_path: Path) -> None:
    # Deselecting (-m) does not hide it: every collected test counts.
    done = collect(tmp_path, TESTS, "-m", "unit")
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "2 test(s) carry no tier marker" in out, out
    assert "test_sample.py::test_untiered\n" in out
    assert "test_sample.py::test_untiered_too[1]" in out
    assert "test_unit" not in out.split("tier marker")[1]
    assert "test_inside" not in out.split("tier marker")[1]


def test_a_fully_tiered_module_collects(tmp_path: Path) -> None:
    tiered = TESTS.split("def test_untiered", maxsplit=1)[0]
    done = collect(tmp_path, tiered)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "4 tests collected" in done.stdout


def test_the_tiers_are_the_registered_markers() -> None:
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "conftest.py")
    assert spec is not None and spec.loader is not None
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    registered = {m.split(":")[0] for m in options["ini_options"]["markers"]}
    assert set(root.TIERS) <= registered

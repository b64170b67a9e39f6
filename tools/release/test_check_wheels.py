"""check_wheels' ``checkout`` check: a wheel that looks up the checkout it was built in is refused,
and the shipped sources (what the wheels are built from) hold no such lookup today."""

from __future__ import annotations

import zipfile
from pathlib import Path

import check_wheels
import pytest

from smg_it.paths import REPO

pytestmark = pytest.mark.unit

CLEAN = b'"""A module."""\nfrom pathlib import Path\nHERE = Path(__file__).parent\n'
LOOKUPS = {
    "walk_up.py": b"ROOT = Path(__file__).resolve().parents[4]\n",
    "walk_up_again.py": b"ROOT = Path(__file__).parent.parent\n",
    "helper.py": b"def repo_root() -> Path: ...\n",
    "venv.py": b'PYTHON = ROOT / ".venv-sglang" / "bin" / "python"\n',
    "kit.py": b"from smg_it.paths import REPO\n",
}


def wheel(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            archive.writestr(f"pkg/{name}", content)
    return path


def test_a_clean_wheel_passes(tmp_path: Path) -> None:
    built = wheel(tmp_path, {"clean.py": CLEAN})
    assert check_wheels.checkout_lookups(check_wheels.wheel_files(built), REPO) == []


def test_every_kind_of_checkout_lookup_is_named(tmp_path: Path) -> None:
    absolute = f'CACHE = "{REPO}/.cache"\n'.encode()
    built = wheel(tmp_path, {**LOOKUPS, "absolute.py": absolute, "clean.py": CLEAN})
    found = check_wheels.checkout_lookups(check_wheels.wheel_files(built), REPO)
    named = {hit.split(":")[1].removeprefix("pkg/") for hit in found}
    assert named == {*LOOKUPS, "absolute.py"}, found


def test_prose_may_name_the_repository_but_not_its_absolute_path(tmp_path: Path) -> None:
    readme = b"The router tests live in `tests-integration/` (the checkout's test kit, smg_it).\n"
    files = [("pkg.dist-info/METADATA", readme)]
    assert check_wheels.checkout_lookups(files, REPO) == []
    leaked = [("pkg.dist-info/METADATA", f"Built in {REPO}/packages.\n".encode())]
    assert len(check_wheels.checkout_lookups(leaked, REPO)) == 1


def test_the_check_fails_on_such_a_wheel(tmp_path: Path) -> None:
    wheel(tmp_path, {"walk_up.py": LOOKUPS["walk_up.py"]})
    with pytest.raises(check_wheels.CheckFailed, match=r"walk_up\.py:1"):
        check_wheels.check_no_checkout(tmp_path, tmp_path)


def test_the_shipped_sources_hold_no_checkout_lookup() -> None:
    """What the wheels are built from (every package's ``src/``), checked before any build."""
    sources = [
        (str(path.relative_to(REPO)), path.read_bytes())
        for path in sorted(REPO.glob("packages/*/src/**/*.py"))
    ]
    assert sources
    assert check_wheels.checkout_lookups(sources, REPO) == []

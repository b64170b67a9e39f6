"""The documentation: the MkDocs site under ``docs/`` builds with ``--strict`` (a link to a page or
an anchor that does not exist fails it, as ``mkdocs.yml``'s ``validation`` says), every page is in
its nav, and the README stays short enough for a newcomer to read to the end (issue #44)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The README's budget: what a first-time user needs, the rest is in docs/.
README_MAX_LINES = 150
#: "[text](target)": a Markdown link; mkdocs checks those between pages, not the root files'.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _nav_pages(nav: object) -> set[str]:
    """Every page named in a MkDocs ``nav`` (nested sections included)."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(item) for item in nav.values()))
    return set()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "index.html").is_file()


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    nav = _nav_pages(config["nav"])
    assert pages == nav, f"not in the nav: {pages - nav}; in the nav, no page: {nav - pages}"


@pytest.mark.parametrize("name", ["README.md", "DEVELOPMENT.md"])
def test_the_root_documents_link_to_files_that_exist(name: str) -> None:
    """Their links into docs/ and the packages (mkdocs reads only docs/) name existing files."""
    targets = [t.split("#")[0] for t in LINK.findall((ROOT / name).read_text())]
    local = [t for t in targets if t and "://" not in t]
    assert local, f"{name} links to no file here"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"{name} links to missing files: {missing}"

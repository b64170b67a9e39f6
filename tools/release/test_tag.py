"""Release tags name one distribution at the version its pyproject and changelog carry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from tag import REPO, TagError, package_for

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("package", sorted((REPO / "packages").iterdir()), ids=lambda p: p.name)
def test_every_package_at_its_version_is_releasable(package: Path) -> None:
    """Each package's current version has its changelog entry, so its tag would publish."""
    version = tomllib.loads((package / "pyproject.toml").read_text())["project"]["version"]
    assert package_for(f"{package.name}-v{version}") == package


@pytest.mark.parametrize(
    ("tag", "why"),
    [
        ("smg-servicer-vllm", "is not <dist>-v<version>"),
        ("smg-servicer-nope-v1.0.0", "not a distribution of this workspace"),
        ("smg-servicer-vllm-v9.9.9", r"not 9\.9\.9"),
    ],
)
def test_bad_tags_are_refused_with_the_reason(tag: str, why: str) -> None:
    with pytest.raises(TagError, match=why):
        package_for(tag)


def test_a_version_without_a_changelog_entry_is_refused(tmp_path: Path) -> None:
    package = tmp_path / "packages" / "smg-x"
    package.mkdir(parents=True)
    (package / "pyproject.toml").write_text('[project]\nname = "smg-x"\nversion = "1.2.3"\n')
    (package / "CHANGELOG.md").write_text("# Changelog\n\n## 1.2.2\n- older\n")
    with pytest.raises(TagError, match=re.escape("no '## 1.2.3' entry")):
        package_for("smg-x-v1.2.3", root=tmp_path)

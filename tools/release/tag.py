"""The one distribution a release tag publishes: ``<dist>-v<version>``.

    python tools/release/tag.py smg-servicer-vllm-v0.4.1     # prints packages/smg-servicer-vllm

Refuses (exit 1, one line why) a tag whose distribution is not in the workspace, whose version
is not the one in that package's pyproject.toml, or whose version has no CHANGELOG.md entry
(``## <version>``): a release is a version bump plus its changelog entry, tagged.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

#: The checkout's root: the current folder (release.yml runs ``python tools/release/tag.py`` there).
REPO = Path.cwd()
TAG = re.compile(r"^(?P<dist>[a-z0-9][a-z0-9-]*?)-v(?P<version>\d+\.\d+\.\d+(?:[a-z]+\d+)?)$")


class TagError(ValueError):
    pass


def package_for(tag: str, root: Path = REPO) -> Path:
    match = TAG.match(tag)
    if match is None:
        raise TagError(f"{tag!r} is not <dist>-v<version> (for example smg-servicer-vllm-v0.4.1)")
    dist, version = match["dist"], match["version"]
    package = root / "packages" / dist
    pyproject = package / "pyproject.toml"
    if not pyproject.is_file():
        raise TagError(f"{dist!r} is not a distribution of this workspace")
    declared = tomllib.loads(pyproject.read_text())["project"]["version"]
    if declared != version:
        raise TagError(f"{dist} is at {declared} in its pyproject.toml, not {version}")
    changelog = package / "CHANGELOG.md"
    entries = re.findall(r"^## (\S+)", changelog.read_text(), re.M) if changelog.is_file() else []
    if version not in entries:
        raise TagError(f"{dist} {version} has no '## {version}' entry in its CHANGELOG.md")
    return package


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tag.py <dist>-v<version>", file=sys.stderr)
        return 2
    try:
        print(package_for(argv[0]).relative_to(REPO))
    except TagError as err:
        print(f"refused: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

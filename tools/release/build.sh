#!/usr/bin/env bash
# Build every distribution as it is published, then check the metadata PyPI will show.
#
#   bash tools/release/build.sh [OUT]      (default: dist/)
#
# --no-sources: each wheel is built against its declared dependencies, not the workspace's
# path sources, so a sibling range that excludes the sibling's current version fails here
# (tools/release/test_metadata.py checks the ranges before a build). twine check --strict
# refuses a README PyPI would not render and missing metadata.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-dist}"
rm -rf "$out"
uv build --quiet --all-packages --no-sources --out-dir "$out"
uv run --no-sync twine check --strict "$out"/*
ls -1 "$out" | grep -v '^\.' | sed 's/^/built  /'

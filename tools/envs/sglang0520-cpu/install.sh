#!/usr/bin/env bash
# The SGLang 0.5.20 CPU test environment (.venv-sglang0520/ at the repo root, or $1): the oldest
# release smg-servicer-sglang declares (issue #28), built as tools/envs/sglang-cpu builds 0.5.23
# (that script says why SGLang goes in with --no-deps and why the shims). The full SGLang
# suite runs on 0.5.23; this environment runs it again on the oldest release's wire and launch
# API (io_struct field order, run_scheduler_process's 0.5.20 signature).
#
# 0.5.20 pins torch==2.13.0 (the machine's wheel folder has its CPU build), transformers 5.12.1,
# tokenizers 0.22.2, openai 2.6.1 and xgrammar 0.2.1 (requirements.txt). The shims are
# sglang-cpu's own (shared, not copied).
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/.venv-sglang0520}"
shims="$(cd "$here/../sglang-cpu/shims" && pwd)"
# shellcheck source=../common.sh
source "$here/../common.sh"
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-sglang)
inputs=("$here/install.sh" "$here/requirements.txt")
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
env_stale sglang0520-cpu "$venv" "${inputs[@]}"
uv pip install --quiet --find-links /opt/wheels -r "$here/requirements.txt"
uv pip install --quiet --no-deps sglang==0.5.20
env_editables "$root" "${members[@]}"
{
    echo "$shims"
    echo "import torchvision_shim; torchvision_shim.install()"
    echo "import pin_memory_shim; pin_memory_shim.install()"
} >"$(env_purelib "$venv")/smg_sglang_cpu_shims.pth"
"$venv/bin/python" - <<'PY'
import os
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
import sglang
import sglang.srt.managers.io_struct  # noqa: F401  (imports the scheduler wire)
import sglang.srt.entrypoints.engine  # noqa: F401
import smg_servicer_sglang, smg_grpc_servicer  # noqa: F401, E401
assert sglang.__version__ == "0.5.20", sglang.__version__
print("sglang0520-cpu env ok")
PY
env_done

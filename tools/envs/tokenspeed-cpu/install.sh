#!/usr/bin/env bash
# The TokenSpeed CPU test environment (.venv-tokenspeed/ at the repo root, or $1): TokenSpeed
# 0.1.1's Python front end on the CPU build of torch, without its CUDA dependencies (2.1 GB
# instead of ~9 GB).
#
# Why a separate environment: tokenspeed 0.1.1 requires ~8.9 GB of CUDA wheels (torch CUDA,
# flashinfer, tokenspeed-kernel, -mooncake, ...) and its own forks of the router, the proto and
# the servicer (tokenspeed-smg, tokenspeed-smg-grpc-proto, tokenspeed-smg-grpc-servicer), which
# would shadow ours. It is installed with --no-deps plus the pinned set of what its front end
# imports on a text model (requirements.txt), and:
#   - tokenspeed-scheduler==0.1.36: 0.1.1 imports CacheGroupFamily, which 0.1.37+ dropped;
#   - three import stubs (stubs/, each says why and when it goes away) on the path via a .pth;
#   - the workspace packages, editable, so the tests run the checkout's code;
#   - the real router (smg), which `ts serve` checks for and the ts-serve test launches.
# SMG_ENV_WITHOUT_CHECKOUT=1 leaves the workspace packages out (and seeds pip): TokenSpeed's
# runtime without our servicer, for the release check of the seed's TokenSpeed line
# (tools/release/check_wheels.py tokenspeed).
# The GPU scheduler itself cannot run here: the tests replace it with the stand-in in
# smg_servicer_tokenspeed.testing.scheduler (SMG_TOKENSPEED_SCHEDULER).
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/.venv-tokenspeed}"
# shellcheck source=../common.sh
source "$here/../common.sh"
# Rebuilt when this script, the pins, the stubs or a workspace package's metadata change.
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-tokenspeed)
inputs=("$here/install.sh" "$here/requirements.txt")
while IFS= read -r stub; do inputs+=("$stub"); done < <(find "$here/stubs" -name '*.py' | sort)
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
env_stale tokenspeed-cpu "$venv" "${inputs[@]}"
# torch 2.13.0+cpu lies in the wheel folder pip is configured with (/opt/wheels).
uv pip install --quiet --find-links /opt/wheels -r "$here/requirements.txt"
uv pip install --quiet --no-deps tokenspeed==0.1.1 tokenspeed-scheduler==0.1.36
if [[ -n "${SMG_ENV_WITHOUT_CHECKOUT:-}" ]]; then
    uv pip install --quiet pip
else
    env_editables "$root" "${members[@]}"
fi
echo "$here/stubs" >"$(env_purelib "$venv")/smg_tokenspeed_cpu_stubs.pth"
"$venv/bin/python" - <<'PY'
import tokenspeed.runtime.engine.io_struct  # noqa: F401  (the scheduler wire)
import tokenspeed.runtime.entrypoints.engine  # noqa: F401  (_launch_subprocesses, AsyncLLM)
import os
import tokenspeed.cli.serve_smg  # noqa: F401  (ts serve)
import smg  # noqa: F401  (the router ts serve checks for)
if not os.environ.get("SMG_ENV_WITHOUT_CHECKOUT"):
    import smg_servicer_tokenspeed._tokenspeed, smg_grpc_servicer  # noqa: F401, E401
print("tokenspeed-cpu env ok")
PY
env_done

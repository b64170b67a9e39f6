#!/usr/bin/env bash
# The replaced implementation as a user installs it beside SGLang, for the lanes benchmark's
# `upstream` arm on SGLang (tools/bench/lanes.py --engine sglang --arms upstream):
# smg-grpc-servicer 0.14.1 from PyPI in an SGLang 0.5.23 CPU environment built exactly as the
# test one (tools/envs/sglang-cpu/install.sh, without this checkout's packages), in its own
# folder (.cache/bench/upstream-sglang, or $1): SGLang's `--smg-grpc-mode` imports its servicer.
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/.cache/bench/upstream-sglang}"
stamp="$venv/.smg-upstream-stamp"
want="$(cat "$here/upstream_sglang_env.sh" "$root/tools/envs/sglang-cpu/install.sh" \
    "$root/tools/envs/sglang-cpu/requirements.txt" | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "upstream-sglang env up to date: $venv"
    exit 0
fi
rm -f "$stamp"
SMG_ENV_WITHOUT_CHECKOUT=1 bash "$root/tools/envs/sglang-cpu/install.sh" "$venv"
# Its [sglang] extra names `sglang` with its CUDA pins: the extra's other two dependencies.
VIRTUAL_ENV="$venv" uv pip install --quiet smg-grpc-servicer==0.14.1 "pyzmq>=25" "msgspec>=0.18"
SGLANG_USE_CPU_ENGINE=1 "$venv/bin/python" - <<'PY'
from importlib import metadata

import sglang.srt.entrypoints.grpc_server  # noqa: F401
import smg_grpc_servicer.sglang.servicer  # noqa: F401

assert metadata.version("smg-grpc-servicer") == "0.14.1"
assert metadata.version("sglang") == "0.5.23"
print("upstream-sglang env ok")
PY
echo "$want" >"$stamp"

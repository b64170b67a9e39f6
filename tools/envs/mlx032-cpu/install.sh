#!/usr/bin/env bash
# The MLX floor environment (.venv-mlx032/ at the repo root, or $1): the oldest MLX this project
# declares, mlx 0.32.0 and mlx-lm 0.32.0 (CPU build), with transformers 5.12.1, the newest the
# seed's `transformers<5.13` allows; the workspace tests the newest (mlx 0.32.4, mlx-lm 0.32.2).
#
# Why 0.32.0 is the floor: smg-servicer-mlx drives mlx-lm's BatchGenerator through the 0.32 API
# (insert(..., stop_sequences=[StopSequences]), next() -> (prompt responses, generation
# responses), remove()); StopSequences first exists in 0.32.0 and 0.31.x has SequenceStateMachine
# in its place (../shared/notes/engine-versions.md §3). Below it no reduced mode is offered.
#
# Idempotent: a second run with the same inputs only checks the stamp file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/.venv-mlx032}"
# shellcheck source=../common.sh
source "$here/../common.sh"
members=(smg-servicer-core smg-grpc-servicer smg-servicer-kv-bridge smg-servicer-mlx)
inputs=("$here/install.sh")
for member in "${members[@]}"; do inputs+=("$root/packages/$member/pyproject.toml"); done
env_stale mlx032-cpu "$venv" "${inputs[@]}"
# The workspace packages editable with their dependencies, MLX held at the floor.
uv pip install --quiet -e "$root/packages/smg-servicer-core[testing,tracing]" \
    -e "$root/packages/smg-servicer-mlx[mlx]" -e "$root/packages/smg-grpc-servicer" \
    -e "$root/packages/smg-servicer-kv-bridge" \
    "mlx[cpu]==0.32.0" "mlx-lm==0.32.0" "transformers==5.12.1" \
    'pytest>=8.3' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
"$venv/bin/python" - <<'PY'
import importlib.metadata as m

got = {name: m.version(name) for name in ("mlx", "mlx-lm", "transformers")}
assert got == {"mlx": "0.32.0", "mlx-lm": "0.32.0", "transformers": "5.12.1"}, got
import smg_servicer_mlx._engine  # noqa: F401  (the BatchGenerator API we drive imports)
print("mlx032-cpu env ok:", got)
PY
env_done

#!/usr/bin/env bash
# MLX servicer vs mlx-lm in-process, same workload (128 tokens; concurrency 1 and 16).
# Usage: bash tools/bench/compare_mlx.sh [MODEL_DIR]   (default: the cached tiny float32 Llama)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-$(uv run python -c "from smg_servicer_core.testing import cached_tiny_model; print(cached_tiny_model('.cache/models'))")}
PORT=$(uv run python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
for c in 1 16; do
  n=$(( c == 1 ? 16 : 128 ))
  uv run python tools/bench/mlx_inprocess.py "$MODEL" --concurrency $c --requests $n --max-tokens 128
done
uv run python -m smg_servicer_mlx --model "$MODEL" --host 127.0.0.1 --port "$PORT" --log-level warning &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.1
done
PID=$(pgrep -P "$SERVER" -f smg_servicer_mlx || echo "$SERVER")
for c in 1 16; do
  n=$(( c == 1 ? 16 : 128 ))
  uv run python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire mlx --server-pid "$PID" \
    --concurrency $c --requests $n --max-tokens 128 --label mlx-servicer
done

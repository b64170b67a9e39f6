#!/usr/bin/env bash
# MLX servicer vs mlx-lm in-process, same workload (128 tokens; concurrency 1 and 16), three
# measurements each:
#   mlx-inprocess         BatchGenerator driven synchronously (the baseline: a freed slot is
#                         refilled between two decode steps, at no cost);
#   mlx-engine-inprocess  the servicer's own MlxEngine driven from asyncio in the same process, no
#                         gRPC (separates the engine wrapper from the gRPC hop);
#   mlx-servicer          the servicer over gRPC, the load generator at `nice 10` (it stands in for
#                         the router, which runs on its own cores in production).
# Usage: bash tools/bench/compare_mlx.sh [MODEL_DIR]   (default: the cached tiny float32 Llama)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN="uv run --no-sync"
MODEL=${1:-$($RUN python -c "from smg_servicer_core.testing import cached_tiny_model; print(cached_tiny_model('.cache/models'))")}
PORT=$($RUN python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
requests() { echo $(( $1 == 1 ? 16 : $1 * 8 )); }
for c in 1 16; do
  for driver in batchgen engine; do
    for _ in 1 2 3; do
      $RUN python tools/bench/mlx_inprocess.py "$MODEL" --driver $driver --concurrency $c \
        --requests "$(requests $c)" --max-tokens 128
    done
  done
done
$RUN python -m smg_servicer_mlx --model "$MODEL" --host 127.0.0.1 --port "$PORT" --log-level warning &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.1
done
PID=$(pgrep -P "$SERVER" -f smg_servicer_mlx || echo "$SERVER")
for c in 1 16; do
  for _ in 1 2 3; do
    $RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire mlx --server-pid "$PID" \
      --nice 10 --concurrency $c --requests "$(requests $c)" --max-tokens 128 --label mlx-servicer
  done
done

#!/usr/bin/env bash
# vLLM servicer (vLLM's own gRPC launcher + our facade) vs AsyncLLM.generate in-process, same
# workload: 128 tokens, concurrency 1, 16 and 64, greedy, ignore_eos. Then the servicer alone on
# a fake engine that costs nothing (server CPU-ms per 1,000 streamed tokens).
# Usage: bash tools/bench/compare_vllm.sh [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN="uv run --no-sync"
MODEL=${1:-$($RUN python -c "from smg_servicer_core.testing import cached_tiny_model; print(cached_tiny_model('$PWD/.cache/models'))")}
free_port() { $RUN python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
wait_port() { for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.2; done; exit 1; }

$RUN python tools/bench/vllm_inprocess.py "$MODEL" --concurrency 1 16 64 --max-tokens 128

PORT=$(free_port)
$RUN python -m vllm.entrypoints.launchers.grpc_server --model "$MODEL" --host 127.0.0.1 \
  --port "$PORT" --dtype float32 --max-model-len 1024 --enforce-eager \
  --kv-cache-memory-bytes 134217728 --disable-log-stats >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_port "$PORT"
$RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire vllm --concurrency 4 \
  --requests 8 --max-tokens 16 >/dev/null   # warm-up
for c in 1 16 64; do
  n=$(( c * 4 > 16 ? c * 4 : 16 ))
  $RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire vllm --server-pid "$SERVER" \
    --concurrency $c --requests $n --max-tokens 128 --label vllm-servicer
done
kill $SERVER; wait $SERVER 2>/dev/null || true

PORT=$(free_port)
$RUN python -m smg_servicer_vllm.testing --port "$PORT" &
SERVER=$!
wait_port "$PORT"
$RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire vllm --server-pid "$SERVER" \
  --concurrency 16 --requests 256 --max-tokens 128 --label vllm-servicer-fake-engine

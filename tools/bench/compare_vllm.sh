#!/usr/bin/env bash
# vLLM servicer (vLLM's own gRPC launcher + our facade) vs AsyncLLM.generate in-process, same
# workload: 128 tokens, concurrency 1, 16 and 64 (concurrency x 10 requests, at least 16), greedy,
# ignore_eos, three measurements each. Then the servicer alone on a fake engine that costs nothing
# (server CPU-ms per 1,000 streamed tokens, after a warm-up run; the fake's own per-token Python is
# in the figure).
#
# CPU layout, the same on both sides: vLLM's model worker alone on its OpenMP cores (all but the last
# CPU), and the front end -- AsyncLLM's process, its EngineCore scheduler and, for the servicer,
# the gRPC load generator -- on the last CPU, the one vLLM reserves for the serving framework.
# Left to the kernel, the front end lands on the worker's core and every stolen slice lengthens a
# decode step (on 2 cores that alone cost the servicer 10-25 % at concurrency 16).
# The load generator stands in for the router, which runs on its own cores in production; it runs
# at `nice 10` so the servicer and the scheduler get the shared core first, then once more at
# normal priority at concurrency 16, so both figures are on record. Each line reports the client's
# own CPU-ms per 1,000 tokens as well.
# Models: by default the tiny test model (1.3 M parameters: vLLM makes ~11,000 tokens/s at
# concurrency 16 on 2 cores, so the fixed per-message cost of gRPC weighs most) and `bench-small`
# (17 M parameters, ~2,600 tokens/s: still far lighter per token than any real model), both built
# once under .cache/models.
# Usage: bash tools/bench/compare_vllm.sh [MODEL_DIR...]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN="uv run --no-sync"
model() {  # [FIELD=VALUE ...] of TinyModelSpec -> the cached model's directory
  $RUN python -c "import sys; from smg_servicer_core.testing.tiny_model import TinyModelSpec, cached_tiny_model
spec = TinyModelSpec(**{k: int(v) for k, v in (a.split('=') for a in sys.argv[1:])})
print(cached_tiny_model('$PWD/.cache/models', spec))" "$@"
}
free_port() { $RUN python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
wait_port() { for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.2; done; exit 1; }
requests() { echo $(( $1 * 10 > 16 ? $1 * 10 : 16 )); }
LAST=$(( $(nproc) - 1 ))
if [ "$LAST" -lt 1 ]; then echo "compare_vllm.sh needs at least 2 CPUs" >&2; exit 2; fi
export VLLM_CPU_OMP_THREADS_BIND=0-$(( LAST - 1 ))
FRONT="taskset -c $LAST"

compare() {  # MODEL_DIR NAME
  NAME=$2
  $FRONT $RUN python tools/bench/vllm_inprocess.py "$1" --concurrency 1 16 64 --max-tokens 128 \
    --repeat 3 --label "vllm-inprocess:$2"
  PORT=$(free_port)
  $FRONT $RUN python -m vllm.entrypoints.launchers.grpc_server --model "$1" --host 127.0.0.1 \
    --port "$PORT" --dtype float32 --max-model-len 1024 --enforce-eager \
    --kv-cache-memory-bytes 134217728 --disable-log-stats >/dev/null 2>&1 &
  SERVER=$!
  wait_port "$PORT"
  bench() {
    $FRONT $RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire vllm \
      --server-pid "$SERVER" --max-tokens 128 --label "vllm-servicer:$NAME" "$@"
  }
  bench --concurrency 4 --requests 8 --max-tokens 16 >/dev/null   # warm-up
  for c in 1 16 64; do
    for _ in 1 2 3; do bench --nice 10 --concurrency $c --requests "$(requests $c)"; done
  done
  for _ in 1 2 3; do bench --concurrency 16 --requests "$(requests 16)"; done
  kill $SERVER; wait $SERVER 2>/dev/null || true
  SERVER=
}
SERVER=
trap 'if [ -n "$SERVER" ]; then kill $SERVER 2>/dev/null || true; fi; wait 2>/dev/null || true' EXIT

if [ $# -gt 0 ]; then
  for model in "$@"; do compare "$model" "$(basename "$model")"; done
else
  compare "$(model)" tiny
  compare "$(model hidden=512 layers=4 heads=8 kv_heads=4 intermediate=1536)" bench-small
fi

PORT=$(free_port)
$RUN python -m smg_servicer_vllm.testing --port "$PORT" &
SERVER=$!
wait_port "$PORT"
fake() {
  $RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire vllm --server-pid "$SERVER" \
    --concurrency 16 --max-tokens 128 --label vllm-servicer-fake-engine "$@"
}
fake --requests 64 >/dev/null   # warm-up: first-call costs (vLLM's lazy imports) stay out
for _ in 1 2 3; do fake --requests 256; done

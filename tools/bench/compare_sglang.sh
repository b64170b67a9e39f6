#!/usr/bin/env bash
# SGLang servicer (sglang serve --smg-grpc-mode, our servicer behind SGLang's launcher) vs
# sglang.Engine.async_generate in-process, same workload: 128 tokens, concurrency 1 and 16,
# greedy, ignore_eos, three runs each. The client for the servicer is smg_bench (gRPC, separate
# process); the in-process client shares SGLang's tokenizer-manager process.
# Usage: bash tools/bench/compare_sglang.sh [MODEL_DIR]   (builds .venv-sglang when missing)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN="uv run --no-sync"
SGL=.venv-sglang/bin/python
bash tools/envs/sglang-cpu/install.sh >/dev/null
export SGLANG_USE_CPU_ENGINE=1
MODEL=${1:-$($RUN python -c "from smg_servicer_core.testing import cached_tiny_model; print(cached_tiny_model('$PWD/.cache/models'))")}
# SGLang refuses ports above 55535 in --smg-grpc-mode.
PORT=$($RUN python -c "import random, socket
for _ in range(200):
    p = random.randrange(20000, 55000); s = socket.socket()
    try: s.bind(('127.0.0.1', p)); print(p); break
    except OSError: pass
    finally: s.close()")
wait_port() { for _ in $(seq 900); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.2; done; exit 1; }

$SGL tools/bench/sglang_inprocess.py "$MODEL" --concurrency 1 16 --max-tokens 128 2>/dev/null

.venv-sglang/bin/sglang serve --model-path "$MODEL" --device cpu --dtype float32 \
  --attention-backend torch_native --sampling-backend pytorch --context-length 1024 \
  --max-total-tokens 65536 --disable-cuda-graph --log-level error --smg-grpc-mode \
  --host 127.0.0.1 --port "$PORT" >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_port "$PORT"
sleep 2  # warm-up request inside the server
$RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire sglang --concurrency 4 \
  --requests 8 --max-tokens 16 >/dev/null   # warm-up
for c in 1 16; do
  n=$(( c * 8 > 16 ? c * 8 : 16 ))
  for _ in 1 2 3; do   # three runs each, as the in-process side
    $RUN python tools/bench/smg_bench.py --target 127.0.0.1:"$PORT" --wire sglang \
      --server-pid "$SERVER" --concurrency $c --requests $n --max-tokens 128 --label sglang-servicer
  done
done

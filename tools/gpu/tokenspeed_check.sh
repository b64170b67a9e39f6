#!/usr/bin/env bash
# The TokenSpeed GPU check: on a machine with an NVIDIA GPU (CUDA 12+ driver, Python 3.11, pip,
# network to PyPI), install TokenSpeed 0.1.1 with its CUDA stack, run our servicer on the tiny
# model with TokenSpeed's REAL scheduler, and run
#   1. the engine tests that neither assert the CPU stand-in's own behaviour nor read what it
#      recorded (packages/smg-servicer-tokenspeed/tests/engine -m "not standin": the shared
#      invalid-input messages, refusals, multimodal objects, the tokenizer bundle, the encoder, the
#      metrics of a known workload, --help, ts serve's own spawn_engine + wait_grpc_serving, the
#      SIGTERM drain at the session worker's stop, and the router's ZMQ lane and the Rust servicer
#      lane over the real scheduler ranks); tools/test_standin_markers.py checks that every test
#      reading the stand-in's records is marked standin, and that this script deselects them;
#   2. one router round trip: tests-integration/test_router.py for tokenspeed (detection, chat and
#      completions streaming or not with usage, client disconnect).
# Usage: bash tools/gpu/tokenspeed_check.sh [venv dir]   (a few minutes; prints a summary line)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
venv="${1:-$root/.venv-tokenspeed-gpu}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install --quiet 'uv>=0.5,<1'
export UV_LINK_MODE=copy UV_NO_PROGRESS=1 VIRTUAL_ENV="$venv"
[[ -x "$venv/bin/python" ]] || uv venv --quiet --python 3.11 "$venv"
# TokenSpeed with its CUDA dependencies; tokenspeed-scheduler <= 0.1.36 (0.1.1 imports
# CacheGroupFamily, which 0.1.37+ dropped).
uv pip install --quiet 'tokenspeed==0.1.1' 'tokenspeed-scheduler==0.1.36'
# TokenSpeed's wheel brings its own forks of the router, the proto and the servicer; they provide
# the same import names as ours (smg, smg_grpc_proto, smg_grpc_servicer): replace them.
uv pip uninstall --quiet tokenspeed-smg tokenspeed-smg-grpc-proto tokenspeed-smg-grpc-servicer || true
uv pip install --quiet 'smg==1.13.0' 'smg-grpc-proto==0.4.28' 'grpcio>=1.81.1' \
    'grpcio-health-checking>=1.81.1' 'grpcio-reflection>=1.81.1' 'prometheus-client>=0.17' \
    psutil numpy tokenizers httpx 'pytest>=8.3' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
uv pip install --quiet --no-deps -e packages/smg-servicer-core -e packages/smg-grpc-servicer \
    -e packages/smg-servicer-kv-bridge -e 'packages/smg-servicer-tokenspeed'
export SMG_TS_REAL_SCHEDULER=1 SMG_TOKENSPEED_PYTHON="$venv/bin/python"
"$venv/bin/python" -c 'import tokenspeed.runtime.entrypoints.engine, smg_servicer_tokenspeed._tokenspeed'
status=0
"$venv/bin/python" -m pytest packages/smg-servicer-tokenspeed/tests/engine -m "not standin" \
    -p no:cacheprovider -q || status=$?
"$venv/bin/python" -m pytest tests-integration/test_router.py -k tokenspeed -m "not standin" \
    -p no:cacheprovider -q || status=$?
echo "tokenspeed GPU check: $([[ $status == 0 ]] && echo PASSED || echo FAILED) (exit $status)"
exit "$status"

#!/usr/bin/env bash
# The whole test suite (the README's test command). Three environments:
#   1. the uv workspace (.venv): every package's unit and contract tests, the vLLM and MLX engine
#      tests, tests-integration/ (the real router in front of every engine) and tools/;
#   2. the SGLang CPU environment (.venv-sglang, tools/envs/sglang-cpu/install.sh):
#      packages/smg-servicer-sglang/tests;
#   3. the TokenSpeed CPU environment (.venv-tokenspeed, tools/envs/tokenspeed-cpu/install.sh):
#      packages/smg-servicer-tokenspeed/tests/engine.
# SGLang and TokenSpeed pin library versions vLLM cannot share, hence their own environments; each
# is built when missing or stale (tests-integration launches their workers from them).
# Extra arguments go to every pytest run (for example -x or -k). Exit non-zero if any fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/envs/sglang-cpu/install.sh || exit 1
bash tools/envs/tokenspeed-cpu/install.sh || exit 1
status=0
uv run pytest "$@" || status=$?
SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/python -m pytest packages/smg-servicer-sglang/tests "$@" || status=$?
.venv-tokenspeed/bin/python -m pytest packages/smg-servicer-tokenspeed/tests/engine "$@" || status=$?
exit "$status"

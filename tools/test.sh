#!/usr/bin/env bash
# The whole test suite (the README's test command). Two environments:
#   1. the uv workspace (.venv): every package but SGLang's, tests-integration/ and tools/;
#   2. the SGLang CPU environment (.venv-sglang, built by tools/envs/sglang-cpu/install.sh
#      when missing or stale): packages/smg-servicer-sglang/tests.
# SGLang pins a CUDA torch and library versions vLLM cannot share, hence two environments.
# Extra arguments go to both pytest runs (for example -x or -k). Exit non-zero if either fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/envs/sglang-cpu/install.sh || exit 1
status=0
uv run pytest "$@" || status=$?
SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/python -m pytest packages/smg-servicer-sglang/tests "$@" || status=$?
exit "$status"

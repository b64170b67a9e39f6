#!/usr/bin/env bash
# The reliability suite as a benchmark: the timing figures no test asserts, measured with enough
# alternated repetitions to state a spread, then held to their bounds.
#
#   bash tools/bench/reliability.sh [extra pytest args]
#
# Runs tests-integration/reliability on every engine (MLX, vLLM, SGLang, TokenSpeed: the SGLang and
# TokenSpeed environments must exist, see tools/test.sh) with the slow reader measured over
# SMG_SLOW_READER_ROUNDS alternated before / with / after rounds (default 5) of SMG_SLOW_READER_S
# seconds (default 30), into a figures file of its own (.cache/reliability/bench.json unless
# SMG_RELIABILITY_FIGURES says otherwise), then prints the table and exits with
# `tools/reliability_report.py --check --bench`: the others' throughput and inter-chunk p99
# within 10 % of the runs without the slow reader (medians over the rounds, their range shown),
# the slow reader served once a second, every stream ended within 1 s of the engine's death,
# plus every behaviour bound of --check. Run on a quiet machine; .github/workflows/bench.yml
# runs it weekly. About 25 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
export SMG_SLOW_READER_ROUNDS="${SMG_SLOW_READER_ROUNDS:-5}"
export SMG_SLOW_READER_S="${SMG_SLOW_READER_S:-30}"
export SMG_RELIABILITY_FIGURES="${SMG_RELIABILITY_FIGURES:-$PWD/.cache/reliability/bench.json}"
rm -f "$SMG_RELIABILITY_FIGURES"
status=0
uv run --no-sync pytest -m reliability tests-integration/reliability "$@" || status=$?
# SGLang's KV events under faults are recorded by its own suite, in its environment.
SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/python -m pytest \
    packages/smg-servicer-sglang/tests/test_contract.py -k kv_events_under_faults "$@" || status=$?
uv run --no-sync python tools/reliability_report.py "$SMG_RELIABILITY_FIGURES" --check --bench \
    || status=$?
exit "$status"

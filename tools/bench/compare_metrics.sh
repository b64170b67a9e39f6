#!/usr/bin/env bash
# The cost of Prometheus metrics: core's fake-engine servicer (costs nothing per token) with
# metrics off and on, alternated in ABBA order (off, on, on, off, ...) so both arms see the same
# machine and a drift in its load does not favour either arm.
# Prints one JSON line per run and, per concurrency, the ratio on/off of the server's CPU per
# 1,000 streamed tokens (median of the runs, and the spread: min..max of the pairwise ratios).
#   bash tools/bench/compare_metrics.sh [runs=3] [requests=256]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs="${1:-3}"
requests="${2:-256}"
out="$(mktemp)"
for concurrency in ${CONCURRENCIES:-16 64}; do
    for run in $(seq 1 "$runs"); do
        arms="no-fake-metrics fake-metrics"
        if (( run % 2 == 0 )); then arms="fake-metrics no-fake-metrics"; fi
        for arm in $arms; do
            uv run --no-sync python tools/bench/smg_bench.py --spawn-fake --"$arm" --nice 10 \
                --concurrency "$concurrency" --requests "$requests" --max-tokens 128 \
                --label "metrics:$arm:c$concurrency:run$run" | tee -a "$out"
        done
    done
done
uv run --no-sync python - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
for c in sorted({r["concurrency"] for r in rows}):
    off = [r["server_cpu_ms_per_1k_tokens"] for r in rows if r["concurrency"] == c and not r["fake_metrics"]]
    on = [r["server_cpu_ms_per_1k_tokens"] for r in rows if r["concurrency"] == c and r["fake_metrics"]]
    ratios = [b / a for a, b in zip(off, on)]
    print(json.dumps({
        "concurrency": c, "cpu_ms_per_1k_off": off, "cpu_ms_per_1k_on": on,
        "ratio_on_off_median": round(statistics.median(ratios), 3),
        "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
    }))
PY

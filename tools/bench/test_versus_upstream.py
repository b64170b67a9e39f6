"""The side-by-side benchmarks run end to end (tiny workloads) and report ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc_path_bench
import pytest
import versus_upstream

HERE = Path(__file__).parent


def _lines(script: str, *flags: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, str(HERE / script), *flags],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.unit
def test_summary_ratios_are_ours_over_upstream() -> None:
    workload = versus_upstream.WORKLOADS[0]
    pairs = [
        ({"tokens_per_server_cpu_s": 300.0}, {"tokens_per_server_cpu_s": 100.0}),
        ({"tokens_per_server_cpu_s": 200.0}, {"tokens_per_server_cpu_s": 100.0}),
        ({"tokens_per_server_cpu_s": 100.0}, {"tokens_per_server_cpu_s": 100.0}),
    ]
    summary = versus_upstream.summary(workload, pairs)
    assert summary["tokens_per_server_cpu_s"] == {
        "ratio_median": 2.0, "ratio_min": 1.0, "ratio_max": 3.0,
    }  # fmt: skip
    assert summary["ours_median"]["tokens_per_server_cpu_s"] == 200.0
    assert "inter_chunk_ms_p99" not in summary  # absent figures give no ratio


@pytest.mark.contract
def test_versus_upstream_measures_both_arms_alternated() -> None:
    """Installs smg-grpc-servicer 0.14.1 from PyPI into the throw-away folder and runs one round."""
    lines = _lines("versus_upstream.py", "--only", "paced-1", "--rounds", "2", "--requests", "2",
                   "--warm-up", "2")  # fmt: skip
    measured = [line for line in lines if "arm" in line]
    assert [m["arm"] for m in measured] == ["ours", "upstream", "upstream", "ours"]
    assert all(m["ok"] == 2 and m["output_tokens"] == 256 for m in measured)
    (summary,) = [line for line in lines if "summary" in line]
    assert summary["summary"] == "paced-1" and summary["rounds"] == 2
    # Paced, so about one token a message on either arm; a stall merges tokens (timing: the
    # benchmark's figure, not this test's). Only well-formedness is checked: a ratio of two
    # positive per-message counts is > 0 in any run that measured both arms (healthy runs give
    # about 1.0, and no stall can push it to 0); it is 0 or absent only when an arm was not read.
    assert summary["tokens_per_message"]["ratio_median"] > 0
    assert summary["server_cpu_ms_per_1k_tokens"]["ratio_median"] > 0


@pytest.mark.unit
def test_a_round_too_short_for_the_cpu_clock_gives_no_ratio() -> None:
    key = "server_cpu_ms_per_1k_tokens"
    rounds = [
        {"generator": {key: 30.0}, "write": {key: 15.0}},
        {"generator": {key: 0.0}, "write": {key: 10.0}},  # under one clock tick
        {"generator": {key: 20.0}, "write": {key: 0.0}},
    ]
    assert grpc_path_bench.summary("write", rounds) == {
        "summary": "write", f"{key}_median": 10.0, "rounds_measured": 1,
        "ratio_to_generator_median": 0.5, "ratio_min": 0.5, "ratio_max": 0.5,
    }  # fmt: skip
    unmeasured = grpc_path_bench.summary("write", rounds[1:2])
    assert unmeasured["rounds_measured"] == 0 and "ratio_to_generator_median" not in unmeasured


@pytest.mark.contract
def test_grpc_path_bench_compares_every_variant() -> None:
    lines = _lines("grpc_path_bench.py", "--rounds", "1", "--requests", "16",
                   "--concurrency", "4", "--delay-ms", "0")  # fmt: skip
    summaries = {line["summary"]: line for line in lines if "summary" in line}
    assert set(summaries) == {
        "generator", "write", "bytes", "generator-asyncio", "bdp-probe-off", "write-buffer-0",
        "vllm-servicer",
    }  # fmt: skip
    assert summaries["generator"]["ratio_to_generator_median"] == 1.0
    measured = [line for line in lines if "label" in line]
    assert all(m["ok"] == 16 and m["output_tokens"] == 16 * 128 for m in measured)

"""tools/reliability_report.py: the table from a figures file, and --check's verdicts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import reliability_report as report

pytestmark = pytest.mark.unit

GOOD: dict[str, Any] = {
    "fuzz_cases": 250,
    "fuzz_codes": {"OK": 100, "INVALID_ARGUMENT": 150},
    "fuzz_failures": 0,
    "malformed_cases": 60,
    "malformed_codes": {"INVALID_ARGUMENT": 60},
    "oversized_code": "RESOURCE_EXHAUSTED",
    "storm_requests": 1000,
    "storm_leaked": 0,
    "storm_bad_endings": 0,
    "storm_rss_ratio": 1.02,
    "storm_tracebacks": 0,
    "slow_throughput_ratio": 0.97,
    "slow_itl_p99_ratio": 1.04,
    "slow_itl_p99_ms": 5.2,
    "slow_base_itl_p99_ms": 5.0,
    "slow_rss_growth_mb": 1.5,
    "slow_reader_s": 30.0,
    "slow_reader_read": 30,
    "slow_rounds": 1,
    "drain_streams": 32,
    "drain_finished": 32,
    "drain_silent": 0,
    "drain_new_call": "UNAVAILABLE",
    "drain_exit": 0,
    "drain_exit_s": 1.2,
    "death_detection_s": 0.2,
    "death_codes": ["UNAVAILABLE"],
    "death_health": "NOT_SERVING",
    "death_exit": 1,
    "death_left": 0,
}


def write(tmp_path: Path, data: Mapping[str, Any]) -> Path:
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(data))
    return path


def test_the_table_has_a_column_per_engine_and_a_row_per_check(tmp_path, capsys) -> None:
    data = {e: dict(GOOD) for e in report.ENGINES}
    data["vllm"]["kv_outcomes"] = {"restart": "DATA_LOSS"}
    assert report.main([str(write(tmp_path, data))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| check | mlx | vllm | sglang | tokenspeed |"
    assert len(lines) == 2 + len(report.ROWS)
    assert "310 cases (100 OK) / 0 failures; 260 MiB: RESOURCE_EXHAUSTED" in lines[2]
    assert "restart: DATA_LOSS" in lines[-1]


def test_a_slow_reader_over_rounds_states_its_spread(tmp_path, capsys) -> None:
    rounds = dict(
        GOOD,
        slow_rounds=5,
        slow_throughput_ratio_min=0.93,
        slow_throughput_ratio_max=1.01,
        slow_itl_p99_ratio_min=0.98,
        slow_itl_p99_ratio_max=1.09,
        slow_vs_control_throughput_ratio=0.99,
        slow_vs_control_throughput_ratio_min=0.95,
        slow_vs_control_throughput_ratio_max=1.02,
        slow_vs_control_itl_p99_ratio=1.0,
        slow_vs_control_itl_p99_ratio_min=0.9,
        slow_vs_control_itl_p99_ratio_max=1.1,
    )
    assert report.main([str(write(tmp_path, {"mlx": dict(GOOD), "vllm": rounds}))]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "ITL p99" in line]
    mlx, vllm = row.split(" | ")[1:3]
    assert "throughput x0.97, ITL p99 x1.04" in mlx and "MiB, 1 round" in mlx
    assert "throughput x0.97 (0.93-1.01), ITL p99 x1.04 (0.98-1.09)" in vllm
    assert (
        "MiB, 5 rounds; vs the same request read at full speed: throughput x0.99 (0.95-1.02)"
        in vllm
    )
    assert "ITL p99 x1.0 (0.9-1.1)" in vllm and "full speed" not in mlx


def test_timing_bounds_are_the_benchmarks_not_the_checks(tmp_path, capsys) -> None:
    """A gate run's figures (one round, a slow death detection on a busy machine) pass --check;
    --check --bench holds the timing figures to their bounds and names each miss."""
    slow = dict(GOOD, death_detection_s=1.4, slow_throughput_ratio=0.8, slow_itl_p99_ratio=1.3)
    slow["slow_reader_read"] = 12
    data = {e: dict(slow, kv_outcomes={"restart": "DATA_LOSS"}) for e in report.ENGINES}
    assert report.main([str(write(tmp_path, data)), "--check"]) == 0
    capsys.readouterr()
    assert report.main([str(write(tmp_path, data)), "--check", "--bench"]) == 1
    err = capsys.readouterr().err
    for expected in (
        "mlx: slow reader measured in 1 rounds, 3 needed",
        "mlx: others' throughput x0.8",
        "mlx: others' inter-chunk p99 x1.3",
        "mlx: the slow reader got 12 messages",
        "mlx: death detected after 1.4 s",
    ):
        assert expected in err, expected
    good = {e: dict(GOOD, slow_rounds=3, kv_outcomes={"a": "b"}) for e in report.ENGINES}
    assert report.main([str(write(tmp_path, good)), "--check", "--bench"]) == 0


def test_check_names_every_missing_or_bad_figure(tmp_path, capsys) -> None:
    bad: dict[str, Any] = dict(GOOD, drain_silent=2)
    bad["fuzz_codes"] = {"OK": 1, "INTERNAL": 3}
    bad["oversized_code"] = "UNKNOWN"
    data = {"mlx": bad, "vllm": dict(GOOD)}
    assert report.main([str(write(tmp_path, data)), "--check"]) == 1
    err = capsys.readouterr().err
    assert "mlx: 4 bad answers to fuzzed input" in err
    assert "mlx: 2 silent truncations" in err
    assert "vllm: no figures for KV events under faults" in err
    assert "sglang: no figures for fuzz" in err
    assert "mlx: no figures for KV" not in err  # KV events are vLLM's and SGLang's


def test_no_figures_file_says_what_to_run(tmp_path, capsys) -> None:
    assert report.main([str(tmp_path / "missing.json")]) == 2
    assert "run the reliability suite first" in capsys.readouterr().err


LANE: dict[str, Any] = {
    **{k: v for k, v in GOOD.items() if not k.startswith(("malformed", "oversized", "fuzz"))},
    "fuzz_cases": 48,
    "fuzz_codes": {"HTTP 200": 10, "HTTP 400": 38},
    "fuzz_failures": 0,
}


def test_a_fast_lanes_column_is_held_to_the_same_bounds(tmp_path, capsys) -> None:
    """The lane suite's columns (HTTP statuses through the router) sit beside the engines' and
    meet the same behaviour bounds; a lane with a failed fuzz answer or a silent truncation
    fails --check, one with a row missing too."""
    data: dict[str, Any] = {e: dict(GOOD) for e in report.ENGINES}
    data["vllm kv"] = {"x": 1}  # not a lane: a column of its own, not checked
    for e in ("vllm", "sglang"):
        data[e]["kv_outcomes"] = {"restart": "DATA_LOSS"}
    data["sglang zmq"] = dict(LANE)
    assert report.main([str(write(tmp_path, data)), "--check"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("| tokenspeed | sglang zmq | vllm kv |")
    assert "48 cases (10 OK) / 0 failures |" in report.table(data)
    for broken in ({"fuzz_failures": 2}, {"drain_silent": 1}, {"storm_leaked": 3}):
        data["sglang zmq"] = {**LANE, **broken}
        assert report.main([str(write(tmp_path, data)), "--check"]) == 1
    data["sglang zmq"] = {k: v for k, v in LANE.items() if not k.startswith("slow")}
    assert report.main([str(write(tmp_path, data)), "--check"]) == 1
    assert "sglang zmq: no figures for slow reader" in capsys.readouterr().err

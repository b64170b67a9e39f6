"""tools/reliability_report.py: the table from a figures file, and --check's verdicts."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

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


def test_a_slow_reader_measured_twice_says_what_the_first_missed(tmp_path, capsys) -> None:
    again = dict(GOOD, slow_attempts=2, slow_first_misses="p99 0.006 vs (0.0052, 0.0050)")
    assert report.main([str(write(tmp_path, {"mlx": dict(GOOD), "vllm": again}))]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "ITL p99" in line]
    mlx, vllm = row.split(" | ")[1:3]
    assert "measured twice" not in mlx
    assert "MiB (measured twice; first: p99 0.006 vs (0.0052, 0.0050))" in vllm


def test_check_names_every_missing_or_bad_figure(tmp_path, capsys) -> None:
    bad: dict[str, Any] = dict(GOOD, death_detection_s=1.4, drain_silent=2)
    bad["fuzz_codes"] = {"OK": 1, "INTERNAL": 3}
    bad["oversized_code"] = "UNKNOWN"
    data = {"mlx": bad, "vllm": dict(GOOD)}
    assert report.main([str(write(tmp_path, data)), "--check"]) == 1
    err = capsys.readouterr().err
    assert "mlx: 4 bad answers to fuzzed input" in err
    assert "mlx: 2 silent truncations" in err
    assert "mlx: death detected after 1.4 s" in err
    assert "vllm: no figures for KV events under faults" in err
    assert "sglang: no figures for fuzz" in err
    assert "mlx: no figures for KV" not in err  # KV events are vLLM's and SGLang's


def test_no_figures_file_says_what_to_run(tmp_path, capsys) -> None:
    assert report.main([str(tmp_path / "missing.json")]) == 2
    assert "run the reliability suite first" in capsys.readouterr().err

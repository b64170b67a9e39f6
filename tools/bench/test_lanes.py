"""tools/bench/lanes.py's client-side reading: SSE lines into streams, streams into figures."""

from __future__ import annotations

import json

import pytest
from lanes import Stream, parse_sse, summarize
from lanes_reading import idle_table, ratios, regressions, report, table, versus_table

pytestmark = pytest.mark.unit


def _chunk(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text}]})


def test_text_chunks_time_the_stream_and_the_usage_chunk_counts_it() -> None:
    stream = Stream(start=0.0)
    parse_sse(_chunk("a"), stream, 0.010)
    parse_sse(_chunk(""), stream, 0.011)  # no text: not a chunk of output
    parse_sse(_chunk("bc"), stream, 0.030)
    parse_sse("data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 3}}), stream, 1)
    parse_sse("data: [DONE]", stream, 2)
    parse_sse(": keep-alive", stream, 2)
    assert (stream.chunks, stream.tokens, stream.error) == ([0.010, 0.030], 3, "")


def test_an_error_event_marks_the_stream() -> None:
    stream = Stream(start=0.0)
    parse_sse("data: " + json.dumps({"error": {"message": "engine died"}}), stream, 0.1)
    assert "engine died" in stream.error


def test_the_figures_of_a_cell() -> None:
    """Arithmetic on fixed, made-up timestamps (nothing is timed here): the figures a cell
    reports are the ones its streams imply."""
    good = Stream(start=0.0, chunks=[0.02, 0.03, 0.05], tokens=4)
    bad = Stream(start=0.0, error="HTTP 500")
    report = summarize([good, good, bad], wall_s=2.0)
    assert (report["ok"], report["errors"], report["output_tokens"]) == (2, 1, 8)
    assert report["output_tokens_per_s"] == 4.0
    assert report["ttft_ms_p50"] == pytest.approx(20.0)
    assert report["itl_ms_p50"] == pytest.approx(15.0)
    assert report["tokens_per_chunk"] == pytest.approx(8 / 6, abs=1e-3)


def test_the_table_has_one_row_per_arm_and_concurrency_with_median_and_range() -> None:
    def row(arm: str, conc: int, tps: float) -> dict:
        keys = ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")
        cpu = ("router", "front_end", "engine")
        return {
            "arm": arm,
            "concurrency": conc,
            "output_tokens_per_s": tps,
            **dict.fromkeys(keys, 1.0),
            **{f"{c}_cpu_us_per_token": 2.0 for c in cpu},
        }

    text = table([row("zmq", 16, 10), row("zmq", 16, 30), row("zmq", 16, 20), row("python", 1, 5)])
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| python | 1 | 5 (5-5)")
    assert lines[3].startswith("| zmq | 16 | 20 (10-30)")


def test_the_in_process_arm_shows_what_it_measures_and_dashes_for_the_rest() -> None:
    inprocess = {"arm": "inprocess", "concurrency": 16, "output_tokens_per_s": 7.0}
    (_, _, line) = table([inprocess]).splitlines()
    assert line.startswith("| inprocess | 16 | 7 (7-7) | - |")


def test_ratios_are_per_round_against_the_baseline_arm() -> None:
    def row(round_no: int, arm: str, tps: float, fe: float | None) -> dict:
        figures = {"output_tokens_per_s": tps, "itl_ms_p99": 2.0, "ttft_ms_p50": 1.0}
        if fe is not None:
            figures |= {"router_cpu_us_per_token": 10.0, "front_end_cpu_us_per_token": fe}
        return {"round": round_no, "arm": arm, "concurrency": 16, **figures}

    rows = [row(0, "python", 100, 90), row(0, "rust", 150, 10), row(1, "python", 200, 40)]
    rows += [row(1, "rust", 100, 0), row(0, "inprocess", 300, None)]
    lines = ratios(rows, "python")
    assert lines[0] == "c16 inprocess/python: tokens/s 3.00; ITL p99 1.00; TTFT p50 1.00"
    assert lines[1] == (
        "c16 rust/python: tokens/s 1.50, 0.50; router+front-end CPU/token 0.20, 0.20; "
        "front-end CPU/token 0.11, 0.00; ITL p99 1.00, 1.00; TTFT p50 1.00, 1.00"
    )


def test_idle_rows_have_a_table_of_their_own_and_stay_out_of_the_load_table() -> None:
    def idle_row(round_no: int, arm: str, front: float) -> dict:
        return {
            "round": round_no,
            "arm": arm,
            "idle_s": 20.0,
            "front_end_idle_cpu_ms_per_s": front,
            "engine_idle_cpu_ms_per_s": 1004.0,
        }

    rows = [idle_row(1, "rust", 1.5), idle_row(0, "rust", 1.0), idle_row(0, "python", 5.0)]
    text = idle_table(rows)
    assert text.splitlines()[2:] == [
        "| python | 5 | 1004 |",
        "| rust | 1, 1.5 | 1004, 1004 |",  # in round order
    ]
    loaded = {"round": 0, "arm": "python", "concurrency": 1, "output_tokens_per_s": 5.0}
    lines: list[str] = []
    report([*rows, loaded], lines.append)
    idle_part, load_part = lines[0], lines[1]
    assert idle_part == text
    assert [line.split(" | ")[0] for line in load_part.splitlines()[2:]] == ["| python"]


def _loaded(round_no: int, arm: str, tps: float, front_end: float, engine: float) -> dict:
    """A load row at 16 streams with the figures the ours-over-theirs reading uses."""
    return {
        "round": round_no,
        "arm": arm,
        "concurrency": 16,
        "output_tokens_per_s": tps,
        "router_cpu_us_per_token": 5.0,
        "front_end_cpu_us_per_token": front_end,
        "engine_cpu_us_per_token": engine,
        "ttft_ms_p50": 2.0,
        "itl_ms_p99": 4.0,
    }


def test_ours_over_the_replaced_implementation_is_the_median_of_the_rounds_ratios() -> None:
    def row(round_no: int, arm: str, tps: float, engine: float) -> dict:
        return _loaded(round_no, arm, tps, 10.0, engine)

    rows = [row(0, "python", 110, 90), row(0, "upstream", 100, 40)]
    rows += [row(1, "python", 90, 30), row(1, "upstream", 100, 30)]
    rows += [row(2, "python", 300, 10), row(2, "upstream", 100, 10), row(3, "python", 1, 1)]
    (_, _, line) = versus_table(rows).splitlines()
    # tokens/s 1.1, 0.9, 3.0; worker CPU (10 + engine) 2.0, 1.0, 1.0; round 3 has no pair
    assert line == (
        "| 16 | 3 | 1.10 (0.90-3.00) | 1.00 (1.00-2.00) | 1.00 (1.00-1.00) | 1.00 (1.00-1.00) |"
    )
    lines: list[str] = []
    report(rows, lines.append)
    assert versus_table(rows) in lines
    alone: list[str] = []  # no replaced arm in the run: no such table
    report([r for r in rows if r["arm"] == "python"], alone.append)
    assert not any(ln.startswith("| conc | rounds |") for ln in alone)


def _pair(round_no: int, tps: float, cpu: float) -> list[dict]:
    """One round of ours and the replaced implementation's at 16 streams (theirs fixed)."""
    return [_loaded(round_no, "python", tps, cpu, 0.0), _loaded(round_no, "upstream", 100, 10, 0)]


def test_a_run_outside_the_baselines_spread_is_a_regression() -> None:
    baseline = [*_pair(0, 95, 10), *_pair(1, 105, 11), *_pair(2, 100, 9)]
    steady = [*_pair(0, 97, 10.5), *_pair(1, 99, 10), *_pair(2, 120, 10)]
    assert regressions(steady, baseline) == []
    slower = [*_pair(0, 90, 10), *_pair(1, 93, 10), *_pair(2, 120, 10)]
    assert regressions(slower, baseline) == ["c16 tokens/s: 0.93, below the baseline's 0.95"]
    costlier = [*_pair(0, 100, 12), *_pair(1, 100, 12), *_pair(2, 100, 9)]
    assert regressions(costlier, baseline) == [
        "c16 worker CPU/token (front end + engine): 1.20, above the baseline's 1.10"
    ]
    assert regressions([], baseline)[0] == "c16 tokens/s: not measured"

"""The reliability suite's figures as a table, one column per engine.

    uv run pytest -m reliability tests-integration/reliability     # writes the figures
    uv run python tools/reliability_report.py [FIGURES_JSON]       # prints the table (Markdown)
    bash tools/bench/reliability.sh                                # benchmark, --check --bench

The figures file is ``.cache/reliability/figures.json`` (``SMG_RELIABILITY_FIGURES`` overrides),
written by ``tests-integration/smg_it/reliability.py``'s ``record``. A check that did not run for
an engine shows ``-``; ``--check`` exits 1 unless every engine has every row and each meets the
suite's behaviour bounds (0 INTERNAL/UNKNOWN answers, 0 leaks, 0 silent truncations).

``--bench`` (with ``--check``) adds the timing bounds, which no test asserts (a ratio of wall-clock
figures on a shared machine is a benchmark, not a test): the slow reader measured over at least
:data:`MIN_ROUNDS` alternated rounds, the others' throughput within 10 % and their inter-chunk p99
within 10 % of the runs without it (medians), the slow reader served about once a second, and
every stream ended within 1 s of the engine's death.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENGINES = ("mlx", "vllm", "sglang", "tokenspeed")
#: The fast lanes' columns (``tests-integration/smg_it/lane_reliability.py``: the same checks
#: through the router, their answers HTTP statuses): written by the lane tests, held to the same
#: behaviour bounds when present; they have no KV row.
LANES = tuple(f"{e} {lane}" for e in ("vllm", "sglang", "tokenspeed") for lane in ("rust", "zmq"))
#: Run from the checkout's root, as every documented command is.
DEFAULT = Path.cwd() / ".cache" / "reliability" / "figures.json"
BAD_CODES = ("INTERNAL", "UNKNOWN", "UNAVAILABLE")
CLIENT_FAULT = ("INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION")

Figures = dict[str, Any]

#: The timing bounds ``--check --bench`` holds a benchmark run to.
MIN_ROUNDS = 3
IMPACT_BOUND = 0.10
DEATH_DETECTION_S = 1.0
#: Of the messages the slow reader asks for (one a second), the share it must get.
SLOW_READ_SHARE = 0.8


def _bad_answers(f: Figures) -> int | None:
    if "fuzz_cases" not in f:
        return None
    codes = {**f.get("fuzz_codes", {})}
    for code, n in f.get("malformed_codes", {}).items():
        codes[code] = codes.get(code, 0) + n
    oversized = f.get("oversized_code")
    bad_oversized = int(oversized is not None and oversized not in CLIENT_FAULT)
    return (
        sum(codes.get(code, 0) for code in BAD_CODES)
        + int(f.get("fuzz_failures", 0))
        + bad_oversized
    )


def _fuzz(f: Figures) -> str | None:
    bad = _bad_answers(f)
    if bad is None:
        return None
    cases = f["fuzz_cases"] + f.get("malformed_cases", 0)
    ok = f.get("fuzz_codes", {}).get("OK", 0)
    ok += f.get("fuzz_codes", {}).get("HTTP 200", 0)
    oversized = f"; 260 MiB: {f['oversized_code']}" if "oversized_code" in f else ""
    return f"{cases} cases ({ok} OK) / {bad} failures{oversized}"


def _storm(f: Figures) -> str | None:
    if "storm_requests" not in f:
        return None
    return (
        f"{f['storm_requests']} requests / {f['storm_leaked']} leaked, "
        f"{f['storm_bad_endings']} bad endings, RSS x{f['storm_rss_ratio']}"
        + (f" then x{f['storm_rss_again_ratio']}" if "storm_rss_again_ratio" in f else "")
        + (f" then x{f['storm_rss_third_ratio']}" if "storm_rss_third_ratio" in f else "")
        + ", "
        f"{f['storm_tracebacks']} tracebacks"
    )


def _slow(f: Figures) -> str | None:
    if "slow_throughput_ratio" not in f:
        return None
    rounds = f.get("slow_rounds", 1)

    def ratio(name: str) -> str:
        if rounds < 2 or f"{name}_min" not in f:
            return f"x{f[name]}"
        return f"x{f[name]} ({f[name + '_min']}-{f[name + '_max']})"

    control = (
        f"; vs the same request read at full speed: throughput "
        f"{ratio('slow_vs_control_throughput_ratio')}, ITL p99 "
        f"{ratio('slow_vs_control_itl_p99_ratio')}"
        if "slow_vs_control_throughput_ratio" in f
        else ""
    )
    return (
        f"throughput {ratio('slow_throughput_ratio')}, ITL p99 {ratio('slow_itl_p99_ratio')} "
        f"({f['slow_base_itl_p99_ms']} → {f['slow_itl_p99_ms']} ms), "
        f"RSS {f['slow_rss_growth_mb']:+} MiB, {rounds} round{'s' * (rounds != 1)}{control}"
    )


def _drain(f: Figures) -> str | None:
    if "drain_streams" not in f:
        return None
    return (
        f"{f['drain_finished']}/{f['drain_streams']} finished, {f['drain_silent']} silent, "
        f"new call {f['drain_new_call']}, exit {f['drain_exit']} in {f['drain_exit_s']} s"
    )


def _death(f: Figures) -> str | None:
    if "death_detection_s" not in f:
        return None
    return (
        f"{f['death_detection_s']:.3f} s, {'/'.join(f['death_codes'])}, health "
        f"{f['death_health']}, exit {f['death_exit']}, {f['death_left']} left"
    )


def _kv(f: Figures) -> str | None:
    if "kv_outcomes" not in f:
        return None
    return ", ".join(f"{k}: {v}" for k, v in sorted(f["kv_outcomes"].items()))


ROWS: tuple[tuple[str, Callable[[Figures], str | None]], ...] = (
    ("fuzz: cases / INTERNAL/UNKNOWN/UNAVAILABLE", _fuzz),
    ("cancel storm", _storm),
    ("slow reader (others vs without it)", _slow),
    ("SIGTERM under load (router)", _drain),
    ("engine death: streams ended after", _death),
    ("KV events under faults", _kv),
)


def timing_violations(engine: str, f: Figures) -> list[str]:
    """What keeps one engine's timing figures from their bounds (``--check --bench``)."""
    found: list[str] = []
    rounds = f.get("slow_rounds", 1)
    if "slow_throughput_ratio" in f:
        if rounds < MIN_ROUNDS:
            found.append(f"{engine}: slow reader measured in {rounds} rounds, {MIN_ROUNDS} needed")
        if f["slow_throughput_ratio"] < 1 - IMPACT_BOUND:
            found.append(f"{engine}: others' throughput x{f['slow_throughput_ratio']}")
        if f["slow_itl_p99_ratio"] > 1 + IMPACT_BOUND:
            found.append(f"{engine}: others' inter-chunk p99 x{f['slow_itl_p99_ratio']}")
        asked = f.get("slow_reader_s", 0) * SLOW_READ_SHARE
        if f.get("slow_reader_read", 0) < asked:
            found.append(f"{engine}: the slow reader got {f.get('slow_reader_read')} messages")
    if f.get("death_detection_s", 0) > DEATH_DETECTION_S:
        found.append(f"{engine}: death detected after {f['death_detection_s']} s")
    return found


def violations(data: dict[str, Figures], bench: bool = False) -> list[str]:
    """What keeps the table from meeting the suite's bounds (``--check``; with ``bench``, the
    timing bounds too). Every engine must have every row; a fast lane's column, where present,
    every row but the KV one."""
    found: list[str] = []
    lanes = [k for k in LANES if k in data]
    for engine in (*ENGINES, *lanes):
        f = data.get(engine, {})
        for title, row in ROWS:
            applies = engine in ("vllm", "sglang") or not title.startswith("KV")
            if applies and row(f) is None:
                found.append(f"{engine}: no figures for {title}")
        if (_bad_answers(f) or 0) > 0:
            found.append(f"{engine}: {_bad_answers(f)} bad answers to fuzzed input")
        if f.get("storm_leaked", 0) or f.get("storm_bad_endings", 0):
            found.append(f"{engine}: the storm leaked or ended badly")
        if f.get("drain_silent", 0):
            found.append(f"{engine}: {f['drain_silent']} silent truncations")
        if bench:
            found += timing_violations(engine, f)
    return found


def table(data: dict[str, Figures]) -> str:
    known = (*ENGINES, *LANES)
    engines = [e for e in known if e in data] + sorted(set(data) - set(known))
    lines = ["| check | " + " | ".join(engines) + " |", "|---" * (len(engines) + 1) + "|"]
    for title, row in ROWS:
        cells = [row(data[e]) or "-" for e in engines]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "figures",
        nargs="?",
        type=Path,
        default=Path(os.environ.get("SMG_RELIABILITY_FIGURES", DEFAULT)),
    )
    parser.add_argument("--check", action="store_true", help="exit 1 on a missing or bad figure")
    parser.add_argument(
        "--bench",
        action="store_true",
        help="with --check: hold the timing figures to their bounds too (a benchmark run's)",
    )
    args = parser.parse_args(argv)
    if not args.figures.exists():
        print(f"no figures at {args.figures}: run the reliability suite first", file=sys.stderr)
        return 2
    data: dict[str, Figures] = json.loads(args.figures.read_text())
    print(table(data))
    if args.check:
        problems = violations(data, bench=args.bench)
        for problem in problems:
            print(f"- {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

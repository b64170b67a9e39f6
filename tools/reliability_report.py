"""The reliability suite's figures as a table, one column per engine.

    uv run pytest -m reliability tests-integration/reliability     # writes the figures
    uv run python tools/reliability_report.py [FIGURES_JSON]       # prints the table (Markdown)

The figures file is ``.cache/reliability/figures.json`` (``SMG_RELIABILITY_FIGURES`` overrides),
written by ``tests-integration/smg_it/reliability.py``'s ``record``. A check that did not run for
an engine shows ``-``; ``--check`` exits 1 unless every engine has every row and each meets the
suite's bounds (0 INTERNAL/UNKNOWN answers, 0 leaks, 0 silent truncations, death detection
within 1 s).
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
DEFAULT = Path(__file__).resolve().parents[1] / ".cache" / "reliability" / "figures.json"
BAD_CODES = ("INTERNAL", "UNKNOWN", "UNAVAILABLE")
CLIENT_FAULT = ("INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION")

Figures = dict[str, Any]


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
    oversized = f.get("oversized_code", "-")
    return f"{cases} cases ({ok} OK) / {bad} failures; 260 MiB: {oversized}"


def _storm(f: Figures) -> str | None:
    if "storm_requests" not in f:
        return None
    return (
        f"{f['storm_requests']} requests / {f['storm_leaked']} leaked, "
        f"{f['storm_bad_endings']} bad endings, RSS x{f['storm_rss_ratio']}, "
        f"{f['storm_tracebacks']} tracebacks"
    )


def _slow(f: Figures) -> str | None:
    if "slow_throughput_ratio" not in f:
        return None
    return (
        f"throughput x{f['slow_throughput_ratio']}, ITL p99 x{f['slow_itl_p99_ratio']} "
        f"({f['slow_base_itl_p99_ms']} → {f['slow_itl_p99_ms']} ms), "
        f"RSS +{f['slow_rss_growth_mb']} MiB"
        + (
            f" (measured twice; first: {f['slow_first_misses']})"
            if f.get("slow_attempts", 1) > 1
            else ""
        )
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


def violations(data: dict[str, Figures]) -> list[str]:
    """What keeps the table from meeting the suite's bounds (``--check``)."""
    found: list[str] = []
    for engine in ENGINES:
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
        if f.get("death_detection_s", 0) > 1.0:
            found.append(f"{engine}: death detected after {f['death_detection_s']} s")
    return found


def table(data: dict[str, Figures]) -> str:
    engines = [e for e in ENGINES if e in data] + sorted(set(data) - set(ENGINES))
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
    args = parser.parse_args(argv)
    if not args.figures.exists():
        print(f"no figures at {args.figures}: run the reliability suite first", file=sys.stderr)
        return 2
    data: dict[str, Figures] = json.loads(args.figures.read_text())
    print(table(data))
    if args.check:
        problems = violations(data)
        for problem in problems:
            print(f"- {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

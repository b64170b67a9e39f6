"""The reading of a lanes run (``tools/bench/lanes.py``'s JSON rows): the load and idle tables,
the per-round ratios of each arm over a baseline arm, ours over the replaced implementation
(:func:`versus_table`) and whether a run stays within a record's spread (:func:`regressions`);
the README's blocks (:func:`markdown`, through ``tools/bench/summarize.py``). Nothing here runs
an engine."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: What an idle row reports (``lanes.idle``), in its table's order.
_IDLE = ("front_end_idle_cpu_ms_per_s", "engine_idle_cpu_ms_per_s")


def idle_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per arm, the idle figures of every round (in round order)."""
    heads = ("front end, each round", "engine, each round")
    lines = ["| arm | " + " | ".join(heads) + " |", "|" + "---|" * (len(_IDLE) + 1)]
    for arm in sorted({r["arm"] for r in rows}):
        mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["round"])
        cells = [", ".join(fig(r[key]) for r in mine) for key in _IDLE]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fig(value: float) -> str:
    """A figure as the tables print it: whole numbers from 100 up, three significant digits
    below (``3312``, ``12.7``, ``0.345``, ``5``)."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


#: The load table's columns: (heading, the row's key).
_COLUMNS = (
    ("tokens/s", "output_tokens_per_s"),
    ("TTFT p50 ms", "ttft_ms_p50"),
    ("TTFT p99 ms", "ttft_ms_p99"),
    ("ITL p50 ms", "itl_ms_p50"),
    ("ITL p99 ms", "itl_ms_p99"),
    ("router µs/tok", "router_cpu_us_per_token"),
    ("front end µs/tok", "front_end_cpu_us_per_token"),
    ("engine µs/tok", "engine_cpu_us_per_token"),
)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Per arm and concurrency, each figure's median over the rounds and its range."""
    keys = [key for _, key in _COLUMNS]
    heads = [head for head, _ in _COLUMNS]
    lines = ["| arm | conc | " + " | ".join(heads) + " |", "|" + "---|" * (len(keys) + 2)]
    cells = sorted({(r["arm"], r["concurrency"]) for r in rows}, key=lambda c: (c[1], c[0]))
    for arm, conc in cells:
        mine = [r for r in rows if (r["arm"], r["concurrency"]) == (arm, conc)]

        def fmt(key: str, mine: list[dict[str, Any]] = mine) -> str:
            values = [r[key] for r in mine if r.get(key) is not None]
            if not values:
                return "-"
            return f"{fig(statistics.median(values))} ({fig(min(values))}-{fig(max(values))})"

        lines.append(f"| {arm} | {conc} | " + " | ".join(fmt(k) for k in keys) + " |")
    return "\n".join(lines)


def _added(*keys: str) -> Callable[[dict[str, Any]], float | None]:
    """A row's figure that is the sum of ``keys`` (None where the row lacks one)."""

    def figure(row: dict[str, Any]) -> float | None:
        values = [row.get(key) for key in keys]
        return None if None in values else float(sum(v for v in values if v is not None))

    return figure


def _round_ratios(
    rows: Sequence[dict[str, Any]],
    arm: str,
    baseline: str,
    concurrency: int,
    figure: Callable[[dict[str, Any]], float | None],
) -> list[float]:
    """``figure`` of ``arm`` over ``baseline``'s at ``concurrency``, one ratio per round that
    has both (in round order)."""
    by = {(r["round"], r["arm"], r["concurrency"]): r for r in rows}
    values = []
    for round_no in sorted({r["round"] for r in rows}):
        mine, base = by.get((round_no, arm, concurrency)), by.get((round_no, baseline, concurrency))
        a = figure(mine) if mine else None
        b = figure(base) if base else None
        if a is not None and b:
            values.append(a / b)
    return values


#: What ``ratios`` compares, each arm against the baseline arm: (name, the row's figure).
_RATIOS: tuple[tuple[str, Callable[[dict[str, Any]], float | None]], ...] = (
    ("tokens/s", lambda r: r.get("output_tokens_per_s")),
    ("router+front-end CPU/token", _added("router_cpu_us_per_token", "front_end_cpu_us_per_token")),
    ("front-end CPU/token", lambda r: r.get("front_end_cpu_us_per_token")),
    ("ITL p99", lambda r: r.get("itl_ms_p99")),
    ("TTFT p50", lambda r: r.get("ttft_ms_p50")),
)


def ratios(rows: Sequence[dict[str, Any]], baseline: str) -> list[str]:
    """Per arm and concurrency, each figure over the baseline arm's of the same round (one ratio
    per round, in round order): the side-by-side reading of an alternated run."""
    arms = sorted({r["arm"] for r in rows} - {baseline})
    lines = []
    for conc in sorted({r["concurrency"] for r in rows}):
        for arm in arms:
            parts = []
            for name, figure in _RATIOS:
                values = _round_ratios(rows, arm, baseline, conc, figure)
                if values:
                    parts.append(f"{name} {', '.join(f'{v:.2f}' for v in values)}")
            if parts:
                lines.append(f"c{conc} {arm}/{baseline}: " + "; ".join(parts))
    return lines


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A run's rows from its JSON lines (a record's header line, ``tools/bench/record.py``,
    left out)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "arm" in r]


def regressions(rows: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]) -> list[str]:
    """Where ``rows`` fall outside ``baseline``'s spread, ours over the replaced implementation
    (:func:`versus`): per concurrency, a figure's median ratio below the baseline's lowest round
    (tokens/s) or above its highest (CPU per token, TTFT, ITL); a figure the baseline has and the
    run lacks is one too. Empty: no regression."""
    now, then = versus(rows), versus(baseline)
    if not then:
        raise SystemExit("--against: the baseline has no python and upstream rounds to compare")
    found = []
    for conc, figures in then.items():
        for name, values in figures.items():
            measured = now.get(conc, {}).get(name)
            if not measured:
                found.append(f"c{conc} {name}: not measured")
                continue
            median = statistics.median(measured)
            low, high = min(values), max(values)
            if name == "tokens/s" and median < low:
                found.append(f"c{conc} {name}: {median:.2f}, below the baseline's {low:.2f}")
            elif name != "tokens/s" and median > high:
                found.append(f"c{conc} {name}: {median:.2f}, above the baseline's {high:.2f}")
    return found


#: What :func:`versus_table` compares, ours over the replaced implementation: (heading, figure).
_VERSUS: tuple[tuple[str, Callable[[dict[str, Any]], float | None]], ...] = (
    ("tokens/s", lambda r: r.get("output_tokens_per_s")),
    (
        "worker CPU/token (front end + engine)",
        _added("front_end_cpu_us_per_token", "engine_cpu_us_per_token"),
    ),
    ("TTFT p50", lambda r: r.get("ttft_ms_p50")),
    ("ITL p99", lambda r: r.get("itl_ms_p99")),
)


def versus(
    rows: Sequence[dict[str, Any]], ours: str = "python"
) -> dict[int, dict[str, list[float]]]:
    """Per concurrency, each :data:`_VERSUS` figure of ``ours`` over the ``upstream`` arm's of
    the same round, one ratio per round (in round order)."""
    out: dict[int, dict[str, list[float]]] = {}
    for conc in sorted({r["concurrency"] for r in rows}):
        for name, figure in _VERSUS:
            values = _round_ratios(rows, ours, "upstream", conc, figure)
            if values:
                out.setdefault(conc, {})[name] = values
    return out


def versus_table(rows: Sequence[dict[str, Any]]) -> str:
    """Ours over the replaced implementation per concurrency: each figure's median over the
    rounds' ratios, its range and the number of rounds (above 1.0 is ours higher: better for
    tokens/s, worse for the rest)."""
    heads = [head for head, _ in _VERSUS]
    lines = ["| conc | rounds | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 2)]
    for conc, figures in versus(rows).items():
        rounds = max(len(v) for v in figures.values())
        cells = []
        for head in heads:
            values = figures.get(head)
            cells.append(
                f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
                if values
                else "-"
            )
        lines.append(f"| {conc} | {rounds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sections(rows: Sequence[dict[str, Any]]) -> Iterator[tuple[str, list[str]]]:
    """A run's reading, in order: (what it is, its lines): the idle table, the load table, and
    the per-round ratios over the Python lane and over the engine in-process (where the run has
    those arms)."""
    idle_rows = [r for r in rows if "idle_s" in r]
    loaded = [r for r in rows if "idle_s" not in r]
    if idle_rows:
        yield "Idle, CPU milliseconds a second, per round:", [idle_table(idle_rows)]
    if loaded:
        yield "Median over the rounds (range):", [table(loaded)]
    arms = {r["arm"] for r in loaded}
    if {"python", "upstream"} <= arms:
        title = "Ours (`python`) over the replaced implementation (`upstream`), per round:"
        yield title, [versus_table(loaded)]
    for baseline in ("python", "inprocess"):
        if any(r["arm"] == baseline for r in loaded):
            yield f"Per round, each figure over the `{baseline}` arm's:", ratios(loaded, baseline)


def report(rows: Sequence[dict[str, Any]], emit: Callable[[str], None]) -> None:
    """The run's reading as plain lines (stderr after a run, ``--summarize``)."""
    for _, lines in sections(rows):
        for line in lines:
            emit(line)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The run's reading as ``tools/bench/README.md`` shows it (``tools/bench/summarize.py``):
    each table under its title, the ratios as a list."""
    parts = []
    for title, lines in sections(rows):
        body = lines[0] if lines[0].startswith("|") else "\n".join(f"- {ln}" for ln in lines)
        parts.append(f"{title}\n\n{body}")
    return "\n\n".join(parts) + "\n"

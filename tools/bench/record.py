"""Run a benchmark and commit what it printed: ``tools/bench/results/NAME.jsonl``, its first line
the record's header (``{"record": {...}}``: the name, the date, the machine, the command, the
revision as the run starts, the seconds it took), then every JSON object line the benchmark wrote
to stdout, as written. The README's tables are printed from these files by
``tools/bench/summarize.py``.

    python tools/bench/record.py NAME -- COMMAND [ARG...]

COMMAND runs from the repository's root with this machine's environment; its stderr passes
through, and its stdout lines that are not JSON objects are echoed and left out of the record.
The record is written only when COMMAND exits 0 (a failed run leaves no file to quote).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests-integration"))
from smg_it.paths import REPO
from smg_it.provenance import machine, revision

RESULTS = REPO / "tools" / "bench" / "results"


def header(name: str, command: list[str], started: str, seconds: float, rev: str) -> dict[str, Any]:
    return {
        "record": {
            "name": name,
            "date": started,
            "machine": machine(),
            "command": shlex.join(command),
            "revision": rev,
            "seconds": round(seconds),
        }
    }


def json_object(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="record.py", description=summary)
    parser.add_argument("name", help="the record's file name, without .jsonl")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: record.py NAME -- COMMAND [ARG...]")
    if not args.name.replace("-", "").replace("_", "").isalnum():
        parser.error(f"NAME must be letters, digits, - and _: {args.name!r}")
    rev = revision()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    at = time.monotonic()
    rows: list[dict[str, Any]] = []
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            row = json_object(line)
            if row is not None:
                rows.append(row)
    if proc.returncode:
        print(f"record.py: {command[0]} exited {proc.returncode}; no record", file=sys.stderr)
        return proc.returncode
    if not rows:
        print("record.py: the command printed no JSON object line; no record", file=sys.stderr)
        return 1
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.jsonl"
    lines = [header(args.name, command, started, time.monotonic() - at, rev), *rows]
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    print(f"record.py: {len(rows)} rows in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

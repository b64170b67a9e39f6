"""What an idle SGLang worker costs, with and without SGLang's ``--sleep-on-idle``: the CPU
seconds of a worker's whole process tree over ``--window`` idle seconds, starting ``--settle``
seconds after it serves. The worker is ``sglang serve --smg-grpc-mode`` with the tests' flags
(:data:`smg_servicer_sglang.testing.CPU_FLAGS`, which hold ``--sleep-on-idle``; the ``spin`` arm
takes it out) on the float32 tiny model. Arms alternated; one JSON line per trial. Run in the
SGLang environment, recorded (``tools/bench/results/2026-12-08-sglang-idle.jsonl``):

    python tools/bench/record.py DATE-sglang-idle -- \\
        .venv-sglang/bin/python tools/bench/sglang_idle.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from smg_bench import cpu_seconds
from smg_servicer_core.testing import cached_tiny_model
from smg_servicer_core.testing.process import free_port
from smg_servicer_sglang.testing import CPU_ENV, serve_command

#: The checkout (its ``.cache/models`` holds the tiny model, built once).
ROOT = Path(__file__).resolve().parents[2]
START_S = 300.0


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _tree_cpu_s(root: psutil.Process) -> float:
    return cpu_seconds([root, *root.children(recursive=True)])


def trial(sleep_on_idle: bool, settle_s: float, window_s: float) -> float:
    """CPU seconds of one idle worker over the window."""
    port = free_port()
    model = cached_tiny_model(ROOT / ".cache" / "models")
    command = serve_command(model, port, python=Path(sys.executable))
    if not sleep_on_idle:
        command.remove("--sleep-on-idle")
    worker = subprocess.Popen(
        command, env={**os.environ, **CPU_ENV}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_S
        while not _listening(port):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not serve (exit {worker.poll()})")
            time.sleep(0.5)
        time.sleep(settle_s)
        root = psutil.Process(worker.pid)
        before = _tree_cpu_s(root)
        time.sleep(window_s)
        return round(_tree_cpu_s(root) - before, 2)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """A recorded run as ``tools/bench/README.md`` shows it (``tools/bench/summarize.py``): each
    arm's CPU seconds over the idle window, per round, and their median."""
    lines = ["| arm | idle window, s | CPU-s per round | median CPU-s |", "|---|---|---|---|"]
    for arm, label in (("spin", "without --sleep-on-idle"), ("sleep", "with --sleep-on-idle")):
        cpu = [float(r["idle_cpu_s"]) for r in rows if r["arm"] == arm]
        if not cpu:
            continue
        window = rows[0]["window_s"]
        each = ", ".join(f"{c:.2f}" for c in cpu)
        lines.append(f"| {label} | {window:g} | {each} | {statistics.median(cpu):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description="An idle SGLang worker's CPU, with and without --sleep-on-idle."
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after it serves")
    parser.add_argument("--window", type=float, default=20.0, help="idle seconds measured")
    args = parser.parse_args()
    for index in range(args.rounds):
        arms = ("spin", "sleep") if index % 2 == 0 else ("sleep", "spin")
        for arm in arms:
            cpu = trial(arm == "sleep", args.settle, args.window)
            row = {"round": index, "arm": arm, "window_s": args.window, "idle_cpu_s": cpu}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

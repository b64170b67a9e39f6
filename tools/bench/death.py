"""Engine death as a user meets it, on every lane, under the router's **default** health and
circuit-breaker flags (issue #41): the engine process is killed (vLLM's engine core, SGLang's
scheduler) while the router in front of the lane (``smg launch``, no health flags) has just
served a request; then a completion is posted every ``--every-s`` for ``--watch-s`` seconds.

    uv run python tools/bench/death.py [--engines vllm sglang] [--arms python rust zmq] \
        [--watch-s 90] [--fast-health] [--out tools/bench/results/DATE-death.jsonl]

``--fast-health``: the router probes each worker's health every second and takes it out at the
first failure (:data:`FAST_HEALTH`, what the README's lane table and example commands pass).

One JSON line per lane (stdout, and ``--out``): every answer after the kill as
``[seconds, status, what it said]``, when the router's ``/workers`` first showed the worker
unhealthy, and the launcher's exit code; then a table (stderr). Read from it:

- *first failure*: when a client first learned of the death (the stream in flight, or the next
  request);
- *still sent to the worker*: the last answer that came from the dead worker (a 500 or 503 of
  the worker's lane) rather than from the router's own "no worker" refusal;
- *unhealthy*: when ``/workers`` said so (the router's health probe: every 60 s, 3 failures,
  by default).

Workers come from ``tools/bench/lanes.py``'s arms (SGLang from ``.venv-sglang``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
from lanes import ROOT, Arm

from smg_servicer_core.testing import cached_tiny_model

#: The engine process each engine's lanes lose (its command line holds this).
VICTIM = {"vllm": "EngineCore", "sglang": "sglang::scheduler"}
#: The router's health flags that take a dead worker out at once (a ZMQ worker's probe reads a
#: flag in the router; a gRPC worker's is one HealthCheck call a second).
FAST_HEALTH = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1")
#: What the router says when it no longer sends a request to any worker.
NO_WORKER = ("no_available_workers", "model_not_found", "No available workers", "not found")


def victim(arm: Arm, engine: str) -> psutil.Process:
    for proc in psutil.Process(arm.worker.proc.pid).children(recursive=True):
        if VICTIM[engine] in " ".join(proc.cmdline()):
            return proc
    raise RuntimeError(f"no {VICTIM[engine]} under the {arm.name} lane's launcher")


def _said(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
    except ValueError:
        return response.text[:120]
    return f"{error.get('code', '')}: {str(error.get('message', ''))[:120]}"


def watch(arm: Arm, engine: str, watch_s: float, every_s: float) -> dict[str, Any]:
    """Kill the engine, then post and read ``/workers`` every ``every_s`` for ``watch_s``."""
    url = arm.router.base + "/v1/completions"
    body = {"model": arm.model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    assert httpx.post(url, json=body, timeout=120).status_code == 200
    target = victim(arm, engine)
    killed = time.monotonic()
    target.kill()
    answers: list[list[Any]] = []
    unhealthy: float | None = None
    while (now := time.monotonic() - killed) < watch_s:
        try:
            reply = httpx.post(url, json=body, timeout=30)
            answers.append([round(now, 2), reply.status_code, _said(reply)])
        except httpx.HTTPError as err:
            answers.append([round(now, 2), 0, type(err).__name__])
        if unhealthy is None:
            workers = httpx.get(arm.router.base + "/workers", timeout=10).json()["workers"]
            if workers and not workers[0]["is_healthy"]:
                unhealthy = round(time.monotonic() - killed, 2)
        time.sleep(every_s)
    return {
        "engine": engine,
        "lane": arm.name,
        "router_flags": " ".join(arm.router_flags) or "defaults",
        "answers": answers,
        "unhealthy_s": unhealthy,
        "launcher_exit": arm.worker.proc.poll(),
        "watch_s": watch_s,
    }


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """First failure, the last answer the dead worker gave, and the health verdict."""
    failed = [a for a in row["answers"] if a[1] != 200]
    from_worker = [a for a in failed if not any(s in a[2] for s in NO_WORKER)]
    statuses = sorted({f"{a[1]}" for a in failed})
    return {
        "first_failure_s": failed[0][0] if failed else None,
        "last_sent_to_worker_s": from_worker[-1][0] if from_worker else None,
        "statuses": "/".join(statuses),
        "unhealthy_s": row["unhealthy_s"],
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    flags = sorted({row.get("router_flags", "defaults") for row in rows})
    lines = [
        f"Router health flags: {', '.join(flags)}.",
        "",
        "| engine | lane | first failure | last answer from the dead worker | statuses | "
        "unhealthy in /workers | launcher exit |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = summary(row)

        def secs(v: float | None, row: dict[str, Any] = row) -> str:
            return "-" if v is None else f"{v} s"

        unhealthy = secs(s["unhealthy_s"]) if s["unhealthy_s"] else f"not in {row['watch_s']} s"
        lines.append(
            f"| {row['engine']} | {row['lane']} | {secs(s['first_failure_s'])} | "
            f"{secs(s['last_sent_to_worker_s'])} | {s['statuses']} | {unhealthy} | "
            f"{row['launcher_exit']} |"
        )
    return "\n".join(lines)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """A recorded run as ``tools/bench/README.md`` shows it (``tools/bench/summarize.py``)."""
    return table(rows)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["vllm", "sglang"], choices=list(VICTIM))
    parser.add_argument("--arms", nargs="+", default=["python", "rust", "zmq"])
    parser.add_argument("--watch-s", type=float, default=90.0)
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--fast-health", action="store_true", help="the router runs FAST_HEALTH")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    model = cached_tiny_model(ROOT / ".cache" / "models")
    rows: list[dict[str, Any]] = []
    for engine in args.engines:
        python = ROOT / ".venv-sglang" / "bin" / "python" if engine == "sglang" else None
        for name in args.arms:
            with tempfile.TemporaryDirectory() as sockets:
                flags = FAST_HEALTH if args.fast_health else ()
                arm = Arm(name, model, Path(sockets), engine, python, router_flags=flags)
                try:
                    row = watch(arm, engine, args.watch_s, args.every_s)
                finally:
                    arm.stop()
            rows.append(row)
            out(json.dumps(row))
            if args.out:
                with args.out.open("a") as sink:
                    sink.write(json.dumps(row) + "\n")
    print(table(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

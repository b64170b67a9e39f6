"""gRPC load generator for any SMG servicer; prints one JSON line.

    python tools/bench/smg_bench.py --spawn-fake --concurrency 16 --requests 256 --max-tokens 128
    python tools/bench/smg_bench.py --target 127.0.0.1:50051 --wire vllm --server-pid 1234 ...

Measures, over ``--requests`` Generate calls kept ``--concurrency`` deep:
output tokens/s, requests/s, TTFT and inter-chunk gaps (p50/p99, ms), the share of streams
*held back* (first chunk after half the stream's total time: the tokens came in a burst at the
end instead of as the engine made them), errors by status code, and, when the server process is
known (``--spawn-fake`` or ``--server-pid``), the CPU-ms its whole process tree spent per 1,000
output tokens and its peak RSS (summed over the tree, sampled every 50 ms); and the load
generator's own CPU-ms per 1,000 output tokens.

The load generator shares the machine with what it measures. In production the router runs on its
own cores; ``--nice 10`` comes closest on a small machine: the client yields the CPU to the engine
and the servicer whenever both want it (the engine comparisons run it that way and say so). The
client runs on uvloop when it is installed (about 15 % less client CPU per streamed token).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import psutil

from smg_servicer_core.testing.process import fake_server_command, spawn_with_port_file
from smg_servicer_core.testing.requests import STUBS, generate_request


@dataclass
class StreamResult:
    tokens: int = 0
    #: Messages that carried output ids (chunks; the ``complete`` of a non-streamed request).
    messages: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list[float])
    total_s: float = 0.0
    error: str | None = None

    @property
    def held_back(self) -> bool:
        return self.ttft_s is not None and self.tokens > 1 and self.ttft_s > self.total_s / 2


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """User plus system CPU seconds of these processes (one that has gone counts 0)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


class TreeSampler:
    """Process-tree CPU time and peak RSS of one server process."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self.own_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_s(self) -> float:
        return cpu_seconds(self._tree())

    def sample_rss(self) -> None:
        rss = 0
        for proc in self._tree():
            try:
                rss += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.sample_rss()
        self.own_cpu_s = time.thread_time()  # this thread's CPU: not the load generator's

    def __enter__(self) -> TreeSampler:
        self.sample_rss()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample_rss()


async def one_request(stub: Any, args: argparse.Namespace, index: int) -> StreamResult:
    prompt = [(index * 13 + i) % 1000 + 10 for i in range(args.prompt_len)]
    request = generate_request(
        args.wire,
        prompt,
        max_tokens=args.max_tokens,
        stream=args.stream,
        request_id=f"bench-{index}",
        ignore_eos=True,
        temperature=0.0,
    )
    result = StreamResult()
    start = last = time.perf_counter()
    try:
        call = stub.Generate(request)
        while (message := await call.read()) is not grpc.aio.EOF:
            now = time.perf_counter()
            kind = message.WhichOneof("response")
            if kind == "chunk" and message.chunk.token_ids:
                if result.ttft_s is None:
                    result.ttft_s = now - start
                else:
                    result.gaps_s.append(now - last)
                result.tokens += len(message.chunk.token_ids)
                result.messages += 1
                last = now
            elif kind == "complete" and not args.stream:
                result.ttft_s = now - start
                result.tokens = message.complete.completion_tokens
                result.messages = 1
    except grpc.aio.AioRpcError as err:
        result.error = err.code().name
    result.total_s = time.perf_counter() - start
    return result


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


async def run_load(
    args: argparse.Namespace, address: str, go: Callable[[], Awaitable[None]] | None = None
) -> tuple[list[StreamResult], float]:
    """``args.requests`` requests kept ``args.concurrency`` deep on one channel, after the
    warm-up; ``go`` (a child of ``--processes``) is awaited between the two."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = STUBS[args.wire](channel)
        for i in range(args.warmup):  # warm the connection and the engine's first-call paths
            await one_request(stub, args, -1 - i - args.index_offset)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(args.requests):
            queue.put_nowait(args.index_offset + i)
        results: list[StreamResult] = []

        async def worker() -> None:
            while not queue.empty():
                results.append(await one_request(stub, args, queue.get_nowait()))

        if go is not None:
            await go()
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        return results, time.perf_counter() - start


async def _child(args: argparse.Namespace) -> None:
    """One load process of ``--processes``: warm up, say ``ready``, wait for ``go`` on stdin,
    run, print the raw results and its CPU seconds since ``go`` as one JSON line."""
    loop = asyncio.get_running_loop()
    cpu_at_go = 0.0

    async def go() -> None:
        nonlocal cpu_at_go
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        cpu_at_go = _client_cpu_s()

    results, wall = await run_load(args, args.target, go)
    raw = [[r.tokens, r.messages, r.ttft_s, r.gaps_s, r.total_s, r.error] for r in results]
    print(json.dumps({"results": raw, "wall_s": wall, "cpu_s": _client_cpu_s() - cpu_at_go}))


def _spread(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_processes(
    args: argparse.Namespace, address: str, sampler: TreeSampler | None
) -> tuple[list[StreamResult], float, float, float]:
    """The load from ``args.processes`` client processes at once (one Python gRPC client costs
    about as much per token as the servicer, so one process can be what saturates first).
    Returns the results, the wall time from ``go`` to the last result, the server tree's CPU
    seconds over it and the clients' CPU seconds."""
    parts = args.processes
    children: list[subprocess.Popen[str]] = []
    offset = 0
    for concurrency, requests in zip(
        _spread(args.concurrency, parts), _spread(args.requests, parts), strict=True
    ):
        cmd = [
            sys.executable, __file__, "--target", address, "--wire", args.wire,
            "--concurrency", str(max(concurrency, 1)), "--requests", str(max(requests, 1)),
            "--max-tokens", str(args.max_tokens), "--prompt-len", str(args.prompt_len),
            "--warmup", str(args.warmup), "--index-offset", str(offset), "--child",
            "--stream" if args.stream else "--no-stream",
        ]  # fmt: skip
        offset += requests + args.warmup
        children.append(
            subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("a load process did not start")
        server_before = sampler.cpu_s() if sampler else 0.0
        start = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = []
        for child in children:
            assert child.stdout is not None
            reports.append(json.loads(child.stdout.readline()))
        wall = time.perf_counter() - start
        server_cpu = (sampler.cpu_s() - server_before) if sampler else 0.0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    results = [
        StreamResult(tokens=t, messages=m, ttft_s=ttft, gaps_s=gaps, total_s=total, error=err)
        for report in reports
        for t, m, ttft, gaps, total, err in report["results"]
    ]
    return results, wall, server_cpu, sum(r["cpu_s"] for r in reports)


def summarize(results: list[StreamResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    tokens = sum(r.tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [g for r in ok for g in r.gaps_s]
    messages = sum(r.messages for r in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "output_tokens": tokens,
        "wall_s": round(wall_s, 3),
        "output_tokens_per_s": round(tokens / wall_s, 1) if wall_s else 0.0,
        "requests_per_s": round(len(ok) / wall_s, 2) if wall_s else 0.0,
        "ttft_ms_p50": _round(_pct(ttfts, 50)),
        "ttft_ms_p99": _round(_pct(ttfts, 99)),
        "inter_chunk_ms_p50": _round(_pct(gaps, 50)),
        "inter_chunk_ms_p99": _round(_pct(gaps, 99)),
        "held_back_share": round(sum(r.held_back for r in ok) / len(ok), 4) if ok else None,
        "tokens_per_message": round(tokens / messages, 3) if messages else None,
        "errors": dict(Counter(r.error for r in results if r.error is not None)),
    }


def spread(ratios: list[float], median_key: str = "ratio_median") -> dict[str, float]:
    """Median, min and max of per-round ratios (3 decimals): how every side-by-side script here
    states a ratio."""
    return {
        median_key: round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
    }


def spread_text(got: dict[str, float], median_key: str = "ratio_median") -> str:
    """A :func:`spread` as the README's tables print it: ``0.95 (0.85-1.46)``."""
    return f"{got[median_key]:.2f} ({got['ratio_min']:.2f}-{got['ratio_max']:.2f})"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def spawn_fake(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], int]:
    port_file = Path(tempfile.mkdtemp()) / "port"
    flags: tuple[str, ...] = (
        "--log-level", "warning", "--token-delay-ms", str(args.fake_token_delay_ms),
    )  # fmt: skip
    if args.fake_metrics:
        flags += ("--metrics-port", "0")
    try:
        return spawn_with_port_file(fake_server_command(port_file, *flags), port_file, output=None)
    except RuntimeError as err:
        raise SystemExit(str(err)) from err


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", help="HOST:PORT of a running servicer")
    where.add_argument(
        "--spawn-fake",
        action="store_true",
        help="start core's fake-engine server (MLX wire) and measure it",
    )
    parser.add_argument("--wire", choices=sorted(STUBS), default="mlx")
    parser.add_argument("--server-pid", type=int, help="measure this process tree's CPU and RSS")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--fake-token-delay-ms",
        type=float,
        default=0.0,
        help="with --spawn-fake: per-token engine time (0 = costs nothing)",
    )
    parser.add_argument(
        "--fake-metrics",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --spawn-fake: serve Prometheus /metrics (measures the metrics' cost)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="lower the client's scheduling priority by this much (0-19) before it starts",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="client processes sharing the load (concurrency and requests split between them)",
    )
    parser.add_argument(
        "--client-cpus",
        default=None,
        help="pin the client processes to these CPUs (a list such as 1 or 2-3)",
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index-offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1:
        parser.error("--concurrency, --requests and --max-tokens must be positive")
    if not 0 <= args.nice <= 19:
        parser.error("--nice must be between 0 and 19")
    if args.processes < 1 or args.processes > args.concurrency:
        parser.error("--processes must be between 1 and --concurrency")
    if args.child and not args.target:
        parser.error("--child needs --target")
    return args


def cpu_list(spec: str) -> set[int]:
    """``"1"``, ``"0,2"``, ``"2-3"`` -> the CPU numbers."""
    cpus: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def client_cpus_beside(server_cpus: set[int], client_cpus: str | None) -> str | None:
    """The load generator's CPU list: as given, else every CPU the server is not pinned to."""
    if client_cpus is not None or not server_cpus:
        return client_cpus
    others = sorted(set(range(os.cpu_count() or 1)) - server_cpus)
    return ",".join(map(str, others)) or None


def measure(
    port: int,
    pid: int,
    *,
    concurrency: int,
    requests: int,
    processes: int,
    label: str,
    client_cpus: str | None,
) -> dict[str, Any]:
    """One run of this script in its own process against the vLLM wire on 127.0.0.1:``port``
    (``pid``'s process tree measured, 128-token streams): its report. Exits on a failed run."""
    cmd = [
        sys.executable, __file__, "--target", f"127.0.0.1:{port}", "--wire", "vllm",
        "--server-pid", str(pid), "--concurrency", str(concurrency), "--requests", str(requests),
        "--max-tokens", "128", "--processes", str(min(processes, concurrency)), "--label", label,
    ]  # fmt: skip
    if client_cpus:
        cmd += ["--client-cpus", client_cpus]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"{label}: the load generator failed\n{out.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def _event_loop_runner() -> tuple[str, Any]:
    try:
        import uvloop  # noqa: PLC0415 - optional, cheaper per message
    except ImportError:
        return "asyncio", asyncio.run
    return "uvloop", uvloop.run


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loop_name, run = _event_loop_runner()
    if args.child:
        run(_child(args))
        return 0
    proc: subprocess.Popen[bytes] | None = None
    if args.spawn_fake:
        proc, port = spawn_fake(args)
        address, pid = f"127.0.0.1:{port}", proc.pid
    else:
        address, pid = args.target, args.server_pid
    if args.nice:
        os.nice(args.nice)  # after spawning the fake server: only the client is lowered
    if args.client_cpus:
        os.sched_setaffinity(0, cpu_list(args.client_cpus))  # children inherit it
    try:
        sampler = TreeSampler(pid) if pid else None
        cpu_before = sampler.cpu_s() if sampler else 0.0
        client_before = _client_cpu_s()
        with sampler if sampler else contextlib.nullcontext():
            if args.processes > 1:
                results, wall, server_s, client_s = run_processes(args, address, sampler)
            else:
                results, wall = run(run_load(args, address))
                server_s = (sampler.cpu_s() - cpu_before) if sampler else 0.0
                client_s = _client_cpu_s() - client_before
        if args.processes == 1 and sampler:
            client_s -= sampler.own_cpu_s  # the sampling thread is not the load generator
        report = summarize(results, wall)
        tokens = max(report["output_tokens"], 1)
        report.update(
            label=args.label,
            wire=args.wire,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            stream=args.stream,
            client_loop=loop_name,
            client_processes=args.processes,
            fake_metrics=args.fake_metrics if args.spawn_fake else None,
            client_nice=os.nice(0),  # the niceness the client really ran at
            client_cpu_ms_per_1k_tokens=round(client_s * 1000 / tokens * 1000, 2),
        )
        if sampler:
            report["server_cpu_ms_per_1k_tokens"] = round(server_s * 1000 / tokens * 1000, 2)
            # Delivered tokens per second of server CPU: tokens/s per fully busy server core.
            report["tokens_per_server_cpu_s"] = round(tokens / server_s, 1) if server_s else None
            report["server_peak_rss_mb"] = round(sampler.peak_rss / 2**20, 1)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] == report["requests"] else 1


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    raise SystemExit(main())

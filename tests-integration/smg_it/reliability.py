"""What the reliability suite (``tests-integration/reliability/``) shares: a worker per engine with
``/metrics`` on, a gRPC client that speaks every wire, the engine's own processes, and the figures
file that ``tools/reliability_report.py`` turns into a table.

Every engine is the real one: MLX in the servicer's process, vLLM CPU behind its own gRPC
launcher, SGLang CPU behind ``sglang serve --smg-grpc-mode`` and TokenSpeed's real front end with
the scheduler stand-in (:mod:`smg_servicer_tokenspeed.testing.scheduler`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

from smg_it.figures import record
from smg_it.harness import Worker, free_port, metered_worker
from smg_it.mlx_dying_engine import with_dying_engine
from smg_servicer_core.testing.metrics import scrape, total, value
from smg_servicer_core.testing.process import wait_serving
from smg_servicer_core.testing.requests import SERVICES, STUBS, WIRES, Wire, generate_request

ENGINES: tuple[Wire, ...] = ("mlx", "vllm", "sglang", "tokenspeed")

__all__ = ["ENGINES", "Target", "engine_processes", "record", "running", "service_name"]

#: The answers a request the client got wrong may get: each names the client's fault.
CLIENT_FAULT = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

#: A traceback in a worker's log: what an unhandled error leaves behind.
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE)

#: The reference request every check ends with: greedy, eight tokens, the same prompt.
REFERENCE_PROMPT = (1, 2, 3, 4, 5)
REFERENCE_TOKENS = 8


def service_name(wire: str) -> str:
    return SERVICES[wire]


@dataclass
class Target:
    """One running worker of ``engine``, its metrics port and what its model allows."""

    engine: Wire
    worker: Worker
    metrics_port: int
    vocab_size: int = 0
    context_length: int = 0
    reference: tuple[int, ...] = ()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.worker.port}"

    @property
    def pid(self) -> int:
        assert self.worker.proc is not None
        return self.worker.proc.pid

    @property
    def pb(self) -> Any:
        return WIRES[self.engine][0]

    def stub(self, channel: Any) -> Any:
        return STUBS[self.engine](channel)

    def request(self, prompt: Sequence[int], **kwargs: Any) -> Any:
        return generate_request(self.engine, prompt, **kwargs)

    def abort_request(self, request_id: str) -> Any:
        if self.engine in ("mlx", "vllm"):
            return self.pb.AbortRequest(request_ids=[request_id])
        return self.pb.AbortRequest(request_id=request_id, reason="reliability")

    def wait_healthy(self, timeout_s: float = 240.0) -> None:
        """Until the worker's health says SERVING (core's poll, bounded; fails at once when the
        process exits)."""
        proc = self.worker.proc

        def alive() -> str | None:
            code = proc.poll() if proc is not None else None
            return None if code is None else f"{self.engine} worker exited {code}"

        wait_serving(self.address, timeout_s=timeout_s, alive=alive)

    def learn(self) -> None:
        """The model's limits and the reference tokens (greedy, from this worker)."""
        with grpc.insecure_channel(self.address) as channel:
            stub = self.stub(channel)
            info = stub.GetModelInfo(self.pb.GetModelInfoRequest(), timeout=30)
            self.vocab_size = int(info.vocab_size)
            self.context_length = int(info.max_context_length)
            self.reference = self.generate_reference(stub)

    def generate_reference(self, stub: Any) -> tuple[int, ...]:
        request = self.request(
            REFERENCE_PROMPT, max_tokens=REFERENCE_TOKENS, temperature=0.0, ignore_eos=True
        )
        complete = None
        for message in stub.Generate(request, timeout=60):
            if message.HasField("complete"):
                complete = message.complete
        assert complete is not None, "no complete message"
        return tuple(complete.output_ids)

    def in_flight(self) -> tuple[float, float]:
        """(requests the servicer tracks, requests the engine holds) from ``/metrics``."""
        samples = scrape(self.metrics_port)
        servicer = value(samples, "smg_servicer_generate_streams_in_flight")
        engine = total(samples, "smg_servicer_engine_running_requests") + total(
            samples, "smg_servicer_engine_waiting_requests"
        )
        return servicer, engine

    def engine_tokens_stand_still(self, settle_s: float = 1.0) -> bool:
        """Whether the engine has stopped making tokens: vLLM's own token counter
        (``vllm:generation_tokens_total``, counted in its engine core's step outputs) reads the
        same twice ``settle_s`` apart. Engines without their own counter on ``/metrics`` answer
        True: their load gauges (:meth:`in_flight`) are already the engine's own counts."""
        if self.engine != "vllm":
            return True
        name = "vllm:generation_tokens_total"
        first = total(scrape(self.metrics_port), name)
        time.sleep(settle_s)
        return first > 0 and total(scrape(self.metrics_port), name) == first

    def wait_idle(self, timeout_s: float = 30.0) -> tuple[float, float, int]:
        """(servicer, engine, ``active_requests``) once all three are 0, or as they are when
        ``timeout_s`` runs out (an engine finishes its abort a step later)."""
        deadline = time.monotonic() + timeout_s
        while True:
            servicer, engine = self.in_flight()
            active = self.active_requests()
            if (servicer, engine, active) == (0, 0, 0) or time.monotonic() > deadline:
                return servicer, engine, active
            time.sleep(0.2)

    def active_requests(self) -> int:
        with grpc.insecure_channel(self.address) as channel:
            info = self.stub(channel).GetServerInfo(self.pb.GetServerInfoRequest(), timeout=30)
            return int(info.active_requests)

    def tree_rss(self) -> int:
        root = psutil.Process(self.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def tracebacks(self) -> list[str]:
        text = self.worker.log.read_text(errors="replace")
        return [text[m.start() : m.start() + 1500] for m in TRACEBACK.finditer(text)]


@contextmanager
def running(engine: Wire, model: Path, mlx_fault: Path | None = None) -> Iterator[Target]:
    """A worker of ``engine`` on the tiny model, healthy, its limits and reference learnt
    (``mlx_fault``: an MLX worker whose engine dies once that file exists,
    :mod:`smg_it.mlx_dying_engine`)."""
    port, metrics_port = free_port(), free_port()
    # vLLM's own stats on: its engine core's counts (GetLoads, vllm:*), not only its front end's.
    worker = metered_worker(engine, model, port, metrics_port, engine_stats=engine == "vllm")
    if mlx_fault is not None:
        assert engine == "mlx", engine
        with_dying_engine(worker.cmd, worker.env, mlx_fault)
    with worker:
        target = Target(engine, worker, metrics_port)
        target.wait_healthy()
        target.learn()
        yield target


def engine_processes(engine: Wire, pid: int) -> list[psutil.Process]:
    """The engine's own processes under the worker ``pid`` (none for MLX: it runs in-process)."""
    patterns = {
        "vllm": ("EngineCore",),
        "sglang": ("sglang::scheduler", "schedul"),
        # TokenSpeed's scheduler rank is a multiprocessing spawn child (not its resource tracker).
        "tokenspeed": ("spawn_main",),
    }.get(engine, ())
    found: list[psutil.Process] = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            text = " ".join([child.name(), *child.cmdline()])
        except psutil.NoSuchProcess:
            continue
        if any(p in text for p in patterns):
            found.append(child)
    return found

"""Worker processes for tests, each launched as users launch it, and the real router in front.

    with mlx_worker(model, free_port()) as worker, Router(worker.url) as router:
        httpx.post(router.base + "/v1/chat/completions", json=...)

Built on core's process harness (:mod:`smg_servicer_core.testing.process`): a :class:`Worker` is
started by :func:`~smg_servicer_core.testing.process.start_worker` (its output in a log file) and
stopped by PID through :meth:`~smg_servicer_core.testing.process.WorkerProcess.stop` (SIGTERM,
then SIGKILL after a grace period), never by process group, so a test runner wrapping us is not
signalled; the router is :class:`smg_servicer_core.testing.router.Router`. Every wait is bounded.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

from smg_it.paths import sglang_python, tokenspeed_python
from smg_servicer_core.testing.process import WorkerProcess, free_port, start_worker
from smg_servicer_core.testing.requests import SERVICES
from smg_servicer_core.testing.router import Router

__all__ = [
    "TRACE_FLAGS",
    "WORKERS",
    "Router",
    "Worker",
    "deployment",
    "free_port",
    "metered_worker",
    "mlx_worker",
    "sglang_worker",
    "stop_tree",
    "tokenspeed_worker",
    "vllm_worker",
]


class Worker:
    """A worker command that will listen on ``port``: ``with worker:`` starts it and waits until
    the port listens, leaving stops it; :meth:`start` alone hands back core's
    :class:`~smg_servicer_core.testing.process.WorkerProcess` (``wait_serving``, ``tail``,
    ``children``). ``env`` is added to this process's environment (and may be changed before
    the start)."""

    def __init__(
        self,
        cmd: Sequence[str],
        port: int,
        *,
        service: str = "",
        start_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.port = port
        self.service = service
        self.start_timeout_s = start_timeout_s
        self.env = dict(env or {})
        self.url = f"grpc://127.0.0.1:{port}"
        self.process: WorkerProcess | None = None
        #: Where its ``/metrics`` is served, when it is (:func:`metered_worker`).
        self.metrics_port: int | None = None

    def start(self) -> WorkerProcess:
        self.process = start_worker(self.cmd, self.port, self.service, self.env)
        return self.process

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.process is None else self.process.proc

    @property
    def log(self) -> Path:
        if self.process is None:
            raise RuntimeError("the worker has not been started")
        return self.process.log

    def stop(self, grace_s: float = 15.0) -> int | None:
        return None if self.process is None else self.process.stop(grace_s)

    def __enter__(self) -> Self:
        try:
            self.start().wait_listening(self.start_timeout_s)
        except BaseException:
            self.stop()  # a start that failed or timed out leaves nothing running
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stop_tree(server: WorkerProcess) -> tuple[int, list[psutil.Process]]:
    """SIGTERM the worker, then kill what was left running of its process tree: (its exit
    code, what had to be killed)."""
    children = server.children()
    code = server.stop()
    _, alive = psutil.wait_procs(children, timeout=10)
    for proc in alive:
        proc.kill()
    return code, alive


def mlx_worker(
    model: str | Path, port: int, *extra: str, env: dict[str, str] | None = None
) -> Worker:
    """The MLX servicer, launched the way the seed README documents (through the facade)."""
    from smg_servicer_mlx.testing import serve_command

    return Worker(serve_command(model, port, *extra), port, service=SERVICES["mlx"], env=env)


def vllm_worker(model: Path, port: int, *extra: str, log_stats: bool = False) -> Worker:
    """vLLM's own gRPC launcher (what ``vllm serve MODEL --grpc`` runs), which imports our
    servicer through ``smg_grpc_servicer.vllm``; CPU-sized for the tiny model, vLLM's stats
    (its ``vllm:*`` metrics) off unless ``log_stats``."""
    from smg_servicer_vllm.testing import launcher_command

    cmd = launcher_command(model, port, *extra, log_stats=log_stats)
    return Worker(cmd, port, service=SERVICES["vllm"], start_timeout_s=240)


def sglang_worker(
    model: Path,
    port: int,
    *extra: str,
    python: Path | None = None,
    env: dict[str, str] | None = None,
    mode_flag: str = "--smg-grpc-mode",
) -> Worker:
    """SGLang's own launcher, ``sglang serve --smg-grpc-mode``, which calls our servicer through
    ``smg_grpc_servicer.sglang.server.serve_grpc``; from the SGLang test environment
    (``.venv-sglang``, or ``python``'s; a missing one fails here with the command that builds
    it). ``port`` must stay below 55536 (:func:`free_port`'s range)."""
    from smg_servicer_sglang.testing import CPU_ENV, serve_command

    cmd = serve_command(model, port, *extra, python=python or sglang_python(), mode_flag=mode_flag)
    return Worker(
        cmd,
        port,
        service=SERVICES["sglang"],
        start_timeout_s=240,
        env={**CPU_ENV, **(env or {})},
    )


def tokenspeed_worker(
    model: Path,
    port: int,
    *extra: str,
    python: Path | None = None,
    env: dict[str, str] | None = None,
    **standin: object,
) -> Worker:
    """``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns) from the TokenSpeed
    test environment (``.venv-tokenspeed``, or ``python``'s; a missing one fails here with the
    command that builds it): TokenSpeed's real front end, its GPU scheduler replaced by the
    stand-in (``standin``: its options)."""
    from smg_servicer_tokenspeed.testing import serve_command, standin_env

    return Worker(
        serve_command(model, port, *extra, python=python or tokenspeed_python()),
        port,
        service=SERVICES["tokenspeed"],
        start_timeout_s=240,
        env={**standin_env(**standin), **(env or {})},
    )


#: engine -> its worker, launched as its users launch it (``WORKERS[engine](model, port, *extra)``)
WORKERS: dict[str, Callable[..., Worker]] = {
    "mlx": mlx_worker,
    "vllm": vllm_worker,
    "sglang": sglang_worker,
    "tokenspeed": tokenspeed_worker,
}


def metered_worker(
    engine: str,
    model: Path,
    port: int,
    metrics_port: int,
    *extra: str,
    engine_stats: bool = False,
) -> Worker:
    """A worker of ``engine`` (``extra``: more of its flags) with ``/metrics`` on
    ``metrics_port`` (:attr:`Worker.metrics_port`): the servicer's metrics, and the engine's own
    where it has them, with ``engine_stats`` (vLLM's stats on: the test workers run with
    ``--disable-log-stats`` otherwise; SGLang's and TokenSpeed's ``--enable-metrics``)."""
    if engine == "sglang":  # SGLang's launcher has no such flag: the servicer's variable
        stats = ("--enable-metrics",) if engine_stats else ()
        worker = sglang_worker(
            model, port, *extra, *stats, env={"SMG_SGLANG_SERVICER_METRICS_PORT": str(metrics_port)}
        )
    elif engine == "vllm":
        metrics = ("--metrics-port", str(metrics_port))
        worker = vllm_worker(model, port, *extra, *metrics, log_stats=engine_stats)
    else:
        stats = ("--enable-metrics",) if engine == "tokenspeed" and engine_stats else ()
        worker = WORKERS[engine](model, port, *extra, *stats, "--metrics-port", str(metrics_port))
    worker.metrics_port = metrics_port
    return worker


#: engine -> the worker flags that send its request spans to an OTLP collector (the engine's own
#: flags: vLLM's and SGLang's; our launchers' ``--otlp-traces-endpoint`` for MLX and TokenSpeed)
TRACE_FLAGS: dict[str, Callable[[str], tuple[str, ...]]] = {
    "mlx": lambda endpoint: ("--otlp-traces-endpoint", endpoint),
    "vllm": lambda endpoint: ("--otlp-traces-endpoint", endpoint),
    "sglang": lambda endpoint: ("--enable-trace", "--otlp-traces-endpoint", endpoint),
    "tokenspeed": lambda endpoint: ("--otlp-traces-endpoint", endpoint),
}
#: Batched spans go out within this (ms) instead of OpenTelemetry's 5 s: tests wait on them.
_SPAN_DELAY = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@contextmanager
def deployment(
    engine: str, model: Path, traces: str | None = None
) -> Iterator[tuple[Worker, Router]]:
    """A worker of ``engine`` on ``model`` (metered, the engine's own stats on:
    :func:`metered_worker`) and the real router in front of it; ``traces``: an OTLP collector
    (``host:port``) both send spans to (the router's ``--enable-trace``, the worker's
    :data:`TRACE_FLAGS`)."""
    worker_flags = TRACE_FLAGS[engine](traces) if traces else ()
    router_flags = ("--enable-trace", "--otlp-traces-endpoint", traces) if traces else ()
    worker = metered_worker(
        engine, model, free_port(), free_port(), *worker_flags, engine_stats=True
    )
    router = Router(worker.url, *router_flags)
    if traces:
        worker.env.update(_SPAN_DELAY)
        router.env.update(_SPAN_DELAY)
    with worker, router:
        yield worker, router

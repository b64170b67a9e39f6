"""The TokenSpeed worker's lifecycle: what ``python -m smg_servicer_tokenspeed`` (and
``python -m smg_grpc_servicer.tokenspeed``, which ``ts serve`` spawns) runs.

1. launch TokenSpeed through its own ``_launch_subprocesses`` (the scheduler ranks and the
   in-process ``AsyncLLM``), blocking until every rank is ready; SIGTERM/SIGINT meanwhile stop the
   launch and the ranks (exit 0); a rank that dies or fails gives exit 1;
2. serve ``TokenSpeedScheduler`` (+ the encoder service: UNIMPLEMENTED but on an encode worker,
   ``--disaggregation-mode encode``) + ``grpc.health.v1`` + reflection on TokenSpeed's
   ``--host``/``--port``; NOT_SERVING until a one-token warm-up request went through the scheduler
   (``SMG_TOKENSPEED_SERVICER_WARMUP=off`` or ``TOKENSPEED_SKIP_GRPC_WARMUP=1`` skip it; an encode
   worker has no language model to warm up: SERVING once launched); a failed warm-up stays
   NOT_SERVING, the reason in the log, and the process keeps running for an operator to look at;
3. core's watchdog: a scheduler rank that exits, signals a failure (SIGQUIT) or a front-end loop
   that fails ends the server with exit 1 within a few tenths of a second, every rank stopped;
4. SIGTERM/SIGINT: NOT_SERVING, in-flight calls drain for up to ``--grace-period`` (30 s; the
   scheduler still running), what is left is cancelled, the ranks are stopped (SIGTERM, 2 s,
   SIGKILL, children included), exit 0; stopping that outlasts the grace period plus
   ``--shutdown-margin`` (15 s) kills the ranks by PID and exits 1 (core's ``shutdown``);
5. TLS with ``--ssl-certfile``/``--ssl-keyfile`` (mutual TLS with ``--ssl-ca-certs``; core's
   ``tls``), read before the launch: a bad file exits 2;
6. ``/metrics`` with ``--metrics-port`` (``SMG_TOKENSPEED_SERVICER_METRICS_PORT``); with
   TokenSpeed's own ``--enable-metrics``, its ``tokenspeed:*`` families beside ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import psutil

from smg_servicer_core.cli import check_metrics_port, serve_servicer, tracing_from
from smg_servicer_core.config import ResolvedSettings
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError, ServicerError
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineFamilies, EngineMetrics, multiprocess_folder
from smg_servicer_core.server import ServerOptions
from smg_servicer_core.tls import ServerTls, load_server_tls
from smg_servicer_core.tracing import Tracing
from smg_servicer_core.watchdog import Watchdog, child_exited
from smg_servicer_tokenspeed import _tokenspeed as ts
from smg_servicer_tokenspeed import convert, kv_events
from smg_servicer_tokenspeed.convert import ChildSpec
from smg_servicer_tokenspeed.servicer import SERVICE_NAME, TokenSpeedServicer
from smg_servicer_tokenspeed.settings import resolve_settings, warmup_wanted

logger = logging.getLogger(__name__)

WARMUP_TIMEOUT_S = 180.0
RANK_STOP_S = 2.0


async def warm_up(servicer: TokenSpeedServicer) -> None:
    """One greedy one-token request through the scheduler; raises if it fails."""
    rid = "WARMUP_generate"
    spec = ChildSpec(rid, 0, [0], {"max_new_tokens": 1, "temperature": 0.0}, False)
    outputs = servicer.llm.generate_request(ts.generate_input(spec, log_metrics=False))
    try:
        async for output in outputs:
            error = convert.failure(convert.frame(output).finish, rid)
            if error is not None:
                raise error
    finally:
        await outputs.aclose()


def stop_ranks(processes: list[Any], grace_s: float = RANK_STOP_S) -> None:
    """SIGTERM every rank and its children, SIGKILL what is left after ``grace_s``."""
    procs: list[psutil.Process] = []
    for process in processes:
        with contextlib.suppress(psutil.Error, ValueError):
            parent = psutil.Process(process.pid)
            procs.extend([*parent.children(recursive=True), parent])
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(0)


class Engine:
    """The launched engine for ``core.server.serve``: warm-up, the watchdog, the shutdown."""

    def __init__(self, launched: ts.Launched, servicer: TokenSpeedServicer, warmup: bool) -> None:
        self.launched = launched
        self.servicer = servicer
        self.warmup = warmup
        self.failure: str | None = None
        self.quit_reason: str | None = None
        checks = [child_exited(f"scheduler rank {p.pid}", p) for p in launched.processes]
        self.watchdog = Watchdog([lambda: self.quit_reason, lambda: self.failure, *checks])
        servicer.dead_reason = self.watchdog.dead_reason
        self.tasks = ts.start_frontend(launched.llm, self._failed)

    def _failed(self, reason: str) -> None:
        self.failure = reason

    def on_sigquit(self) -> None:
        self.quit_reason = "a scheduler rank reported a fatal error (SIGQUIT)"

    async def wait_ready(self) -> None:
        if self.servicer.encode_role:
            logger.info("encode worker: no language model to warm up")
            return
        if not self.warmup:
            logger.info("warm-up skipped")
            return
        try:
            await asyncio.wait_for(warm_up(self.servicer), WARMUP_TIMEOUT_S)
        except Exception as exc:
            detail = exc.message if isinstance(exc, ServicerError) else type(exc).__name__
            logger.error("warm-up failed (%s): staying NOT_SERVING", detail)
            logger.debug("warm-up failure", exc_info=True)
            await asyncio.Event().wait()  # NOT_SERVING until a stop signal or engine death
        logger.info("warm-up request done")

    async def wait_dead(self) -> str:
        return await self.watchdog.wait_dead()

    async def shutdown(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.to_thread(stop_ranks, self.launched.processes)
        logger.info("scheduler ranks stopped")


class _LaunchStopped(Exception):
    pass


@contextlib.contextmanager
def _stoppable_launch() -> Generator[None]:
    """SIGTERM/SIGINT during the (blocking) launch raise :class:`_LaunchStopped` on the main
    thread, so the ranks started so far are stopped instead of orphaned."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _LaunchStopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _launch(server_args: Any) -> ts.Launched | int:
    import multiprocessing  # noqa: PLC0415 - only for the ranks a failed launch leaves

    try:
        with _stoppable_launch():
            return ts.launch(server_args)
    except _LaunchStopped as exc:
        logger.info("stopped during the launch (%s)", exc)
        stop_ranks(multiprocessing.active_children())
        return ExitCode.OK
    except ts.LaunchError as exc:
        logger.error("TokenSpeed failed to start: %s", exc)
        stop_ranks(multiprocessing.active_children())
        return ExitCode.ENGINE_DIED
    except ValueError as exc:  # TokenSpeed's own refusal of its flags or the model
        logger.error("invalid configuration: TokenSpeed refused it: %s", exc)
        stop_ranks(multiprocessing.active_children())
        return ExitCode.CONFIG


async def run(
    server_args: Any,
    settings: ResolvedSettings | None = None,
    on_started: Callable[[int], None] | None = None,
) -> int:
    """Launch, serve until a stop signal or engine death, stop. Returns the exit code."""
    try:
        own = settings if settings is not None else resolve_settings()
        check_metrics_port(own, int(server_args.port))
        tls = load_server_tls(own)
        tracing = tracing_from(own, "smg-servicer-tokenspeed")  # a missing SDK: before launch
        kv_events.parse_config(getattr(server_args, "kv_events_config", None))
        launched = _launch(server_args)
    except ConfigError as exc:  # a flag, a variable, or SMG_TOKENSPEED_SCHEDULER unusable
        logger.error("invalid configuration: %s", exc)
        return ExitCode.CONFIG
    if isinstance(launched, int):
        return launched
    return await _serve(server_args, own, tls, launched, on_started, tracing=tracing)


def _engine_metrics(server_args: Any) -> EngineMetrics | None:
    """TokenSpeed's own ``tokenspeed:*`` families with its ``--enable-metrics``: the front end's
    (its ``AsyncLLM`` counts each request in this process) and what its ranks write to the
    multi-process folder TokenSpeed sets up."""
    if not getattr(server_args, "enable_metrics", False):
        return None
    return EngineMetrics(EngineFamilies("tokenspeed:", multiprocess_folder()), "tokenspeed")


async def _serve(
    server_args: Any,
    own: ResolvedSettings,
    tls: ServerTls | None,
    launched: ts.Launched,
    on_started: Callable[[int], None] | None,
    *,
    tracing: Tracing | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    health = HealthFrame(SERVICE_NAME)
    try:
        servicer = TokenSpeedServicer(launched, health=health)
        engine = Engine(launched, servicer, warmup_wanted())
    except Exception:
        logger.exception("start-up failed after the scheduler ranks started")
        await asyncio.to_thread(stop_ranks, launched.processes)
        return ExitCode.ENGINE_DIED
    # TokenSpeed's launch-phase SIGQUIT handler kills the process tree; ours stops cleanly.
    loop.add_signal_handler(signal.SIGQUIT, engine.on_sigquit)
    options = ServerOptions(
        host=str(server_args.host),
        port=int(server_args.port),
        grace_period_s=own["grace_period_s"],
        max_message_bytes=own["max_message_bytes"],
        tls=tls,
        shutdown_margin_s=own["shutdown_margin_s"],
    )
    try:
        bindings = servicer.bindings()
        return await serve_servicer(
            servicer, bindings, health, engine, options, resolved=own, on_started=on_started,
            tracing=tracing, engine_metrics=_engine_metrics(server_args),
        )  # fmt: skip
    finally:
        loop.remove_signal_handler(signal.SIGQUIT)

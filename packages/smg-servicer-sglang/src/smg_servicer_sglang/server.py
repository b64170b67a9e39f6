"""``serve_grpc(server_args, model_info=None, on_request_manager_ready=None)``: what
``sglang serve --smg-grpc-mode`` calls (through ``smg_grpc_servicer.sglang.server``).

The servicer process takes the tokenizer manager's role:

1. validate and publish ``server_args`` (as SGLang's own launcher does), bind the scheduler
   sockets, start every scheduler rank this node runs and wait until all are ready;
2. call ``on_request_manager_ready(request_manager, server_args, scheduler_info)`` (SGLang starts
   its HTTP sidecar there);
3. serve ``SglangScheduler`` + ``grpc.health.v1`` + reflection; NOT_SERVING until a warm-up
   request went through (``--skip-server-warmup`` or ``SMG_SGLANG_SERVICER_WARMUP=off`` skip it);
4. health (``grpc.health.v1`` and ``HealthCheck``) turns NOT_SERVING while the scheduler is
   silent for 30 s with requests pending, and back when it answers (the servicer's probe);
5. SIGTERM/SIGINT: NOT_SERVING, drain in-flight calls for up to the grace period
   (``--grace-period`` / ``SMG_SERVICER_GRACE_PERIOD_S``, 30 s; sockets still open), fail what
   is left, stop the schedulers (SIGTERM, 2 s, SIGKILL), exit 0; stopping that outlasts the
   grace period plus ``--shutdown-margin`` (``SMG_SERVICER_SHUTDOWN_MARGIN_S``, 15 s) kills the
   scheduler processes by PID and exits 1 (core's ``shutdown``);
6. a scheduler that exits (or signals a failure with SIGQUIT) ends the server with exit 1 within
   a few tenths of a second (core's watchdog); a scheduler that cannot start gives exit 1, an
   invalid configuration exit 2 (core's ``ExitCode``);
7. TLS: SGLang's own ``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certs`` (client
   certificates required) and ``--ssl-keyfile-password`` make the gRPC port TLS-only (core's
   ``tls``; ``SMG_SERVICER_SSL_*`` when the flags are absent);
8. ``/metrics`` when ``SMG_SGLANG_SERVICER_METRICS_PORT`` (or ``--metrics-port`` of
   ``python -m smg_servicer_sglang``) is set;
9. SGLang's own ``--enable-trace`` / ``--otlp-traces-endpoint``: each ``Generate`` that carries
   the router's trace context gets a span, a child of the router's (core's ``tracing``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from smg_servicer_core.cli import (
    SERVER_SETTINGS,
    check_metrics_port,
    metrics_settings,
    serve_servicer,
)
from smg_servicer_core.config import (
    ResolvedSettings,
    Setting,
    environment,
    parse_bool,
    resolve,
    setting_value,
)
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineFamilies, EngineMetrics, multiprocess_folder
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.server import ServerOptions
from smg_servicer_core.shutdown import SHUTDOWN_MARGIN
from smg_servicer_core.tls import ServerTls, resolve_tls
from smg_servicer_core.tracing import Tracing, start_tracing
from smg_servicer_core.watchdog import Watchdog
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang import convert, kv_events, lora, rust_lane
from smg_servicer_sglang.engine_metrics import RequestMetrics
from smg_servicer_sglang.request_manager import RequestManager
from smg_servicer_sglang.servicer import SERVICE_NAME, SglangServicer

logger = logging.getLogger(__name__)

WARMUP_ENV = "SMG_SGLANG_SERVICER_WARMUP"
WARMUP = Setting("warmup", parse_bool, True, "one warm-up request before SERVING", env=WARMUP_ENV)
WARMUP_TIMEOUT_S = 300.0
SCHEDULER_STOP_S = 2.0

ReadyCallback = Callable[[Any, Any, dict[str, Any]], Awaitable[None]]


def warmup_wanted(config: Any, environ: Mapping[str, str] | None = None) -> bool:
    if getattr(config, "skip_server_warmup", False):
        return False
    return bool(setting_value(WARMUP, environ))


def warmup_ids(vocab_size: int, count: int = 7) -> list[int]:
    """Distinct prompt ids inside the vocabulary, however small it is."""
    return [(97 * k) % vocab_size for k in range(1, count + 1)]


async def warm_up(servicer: SglangServicer) -> None:
    """One greedy 8-token generate (or one embed) through the scheduler; raises if it fails."""
    ids = warmup_ids(servicer.limits.vocab_size)
    tokenized = pb.TokenizedInput(input_ids=ids)
    if not servicer.limits.is_generation:
        req = sg.build_embed(
            convert.embed_req(
                pb.EmbedRequest(request_id="WARMUP_embed", tokenized=tokenized), servicer.limits
            ),
            servicer.tokenizer,
        )
        servicer.manager.open([req.rid])
        try:
            await servicer.manager.send(req)
            async for batch in servicer.manager.stream(req.rid):
                if (error := convert.failure(batch[-1].finish)) is not None:
                    raise error
        finally:
            await servicer.manager.release([req.rid])
        return
    request = pb.GenerateRequest(
        request_id="WARMUP_generate",
        tokenized=tokenized,
        sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=8),
    )
    if local := sg.local_only(servicer.config):  # prefill or decode: this worker alone
        request.disaggregated_params.CopyFrom(pb.DisaggregatedParams(**local))
    specs, _ = convert.generate_reqs(request, servicer.limits)
    req = sg.build_generate(specs[0], servicer.limits.vocab_size, servicer.tokenizer)
    async for _ in servicer._single(request, req):  # pyright: ignore[reportPrivateUsage]
        pass


class Schedulers:
    """The scheduler ranks' lifecycle for ``core.server.serve``: core's process watchdog over the
    ranks, a scheduler's SIGQUIT and the scheduler stream; stall transitions are logged (the
    servicer's health probe reports them)."""

    def __init__(
        self, launched: sg.Launched, manager: RequestManager, servicer: SglangServicer,
        health: HealthFrame, warmup: bool,
    ) -> None:  # fmt: skip
        self.launched = launched
        self.manager = manager
        self.servicer = servicer
        self.health = health
        self.warmup = warmup
        self.quit_reason: str | None = None
        #: A prefill worker's KV bootstrap server (kept alive with the schedulers).
        self.bootstrap_server: Any = None
        self._stalled = False
        self.watchdog = Watchdog(
            [lambda: self.quit_reason, launched.dead, lambda: manager.failed]
        )  # core's interval (0.1 s), as TokenSpeed's
        self.watchdog.on_tick = self._watch_stall
        servicer.dead_reason = self.watchdog.dead_reason

    def on_sigquit(self) -> None:
        self.quit_reason = "a scheduler process reported a fatal error (SIGQUIT)"

    async def wait_ready(self) -> None:
        if not self.warmup:
            logger.info("warm-up skipped")
            return
        await asyncio.wait_for(warm_up(self.servicer), WARMUP_TIMEOUT_S)
        logger.info("warm-up request done")

    async def wait_dead(self) -> str:
        return await self.watchdog.wait_dead()

    def _watch_stall(self) -> None:
        stalled = self.manager.stalled
        if stalled != self._stalled:
            self._stalled = stalled
            if stalled:
                logger.warning(
                    "scheduler silent for %.0fs with %d request(s) pending: NOT_SERVING",
                    self.manager.stalled_for(),
                    self.manager.active,
                )
            else:
                logger.info("scheduler answering again: SERVING")

    async def shutdown(self) -> None:
        await self.manager.close()
        await asyncio.to_thread(
            sg.terminate, self.launched.processes, SCHEDULER_STOP_S, self.launched.pids
        )
        reader = self.launched.load_reader
        if reader is not None:
            reader.close()
        logger.info("schedulers stopped")


class _QuitSignal:
    """SIGQUIT from a scheduler (its "I failed" signal) at any point of the process's life."""

    def __init__(self) -> None:
        self.seen = False
        self.target: Schedulers | None = None

    def __call__(self) -> None:
        self.seen = True
        if self.target is not None:
            self.target.on_sigquit()


async def _start(
    server_args: Any, quit_signal: _QuitSignal, own: ResolvedSettings
) -> Schedulers | int:
    """Everything up to serving: the running schedulers and servicer, or an exit code."""
    try:
        kv_events.parse_config(getattr(server_args, "kv_events_config", None))
        port_args, config = sg.prepare(server_args)
        # Before the ranks start, as SGLang's tokenizer manager does: the encoders register
        # with its bootstrap server.
        encoder = sg.encoder_side(server_args, config)
    except (ConfigError, ValueError, TypeError) as exc:
        logger.error("invalid configuration: %s", exc)
        return ExitCode.CONFIG
    try:  # before the prefill ranks start: they register with it
        bootstrap = sg.start_bootstrap_server(config)
    except OSError as exc:
        logger.error(
            "invalid configuration: the KV bootstrap server cannot listen on port %s (%s)",
            config.disaggregation_bootstrap_port, exc.strerror or type(exc).__name__,
        )  # fmt: skip
        return ExitCode.CONFIG
    # After prepare(): SGLang's launch-time SIGQUIT handler kills the whole process tree; ours
    # turns a scheduler's failure into a clean stop with exit 1.
    asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, quit_signal)
    manager = RequestManager(port_args, sg.dp_size(), drafts_per_verify=sg.drafts_per_verify())
    # Before the launch: the ranks inherit where to write their metrics.
    try:
        collector = sg.tokenizer_metrics(server_args)
    except Exception as exc:  # observability never stops serving
        logger.warning("SGLang's own metrics are off (%s)", type(exc).__name__)
        collector = None
    if collector is not None:
        manager.metrics = RequestMetrics(collector, prefill_only=sg.prefill_only())
    try:
        request_traces = sg.start_request_tracing(server_args)
    except Exception as exc:  # observability never stops serving
        logger.warning("SGLang's own request traces are off (%s)", type(exc).__name__)
        request_traces = False
    try:
        launched = await asyncio.to_thread(sg.launch_schedulers, server_args, port_args)
    except sg.SchedulerStartError as exc:
        logger.error("schedulers failed to start: %s", exc)
        await manager.close()
        return ExitCode.ENGINE_DIED
    manager.start()
    if manager.metrics is not None:
        manager.metrics.started(launched.startup_time)
    try:
        facts = sg.model_facts(server_args)
        tokenizer = await asyncio.to_thread(sg.load_tokenizer, config)
    except Exception:
        logger.exception("start-up failed after the schedulers started")
        await manager.close()
        await asyncio.to_thread(sg.terminate, launched.processes, SCHEDULER_STOP_S, launched.pids)
        return ExitCode.ENGINE_DIED
    health = HealthFrame(SERVICE_NAME)
    servicer = SglangServicer(
        manager,
        server_args=server_args,
        config=config,
        scheduler_info=launched.scheduler_info,
        facts=facts,
        health=health,
        tokenizer=tokenizer,
        load_reader=launched.load_reader,
        adapters=lora.Adapters.of(config, manager, own[lora.ALLOWED_DIRS.name]),
        request_traces=request_traces,
        encoder=encoder,
    )
    schedulers = Schedulers(launched, manager, servicer, health, warmup_wanted(config))
    schedulers.bootstrap_server = bootstrap
    quit_signal.target = schedulers
    if quit_signal.seen:
        schedulers.on_sigquit()
    return schedulers


def servicer_settings() -> tuple[Setting[Any], ...]:
    """The servicer's own settings (SGLang owns host, port and logging): the shared grace period
    and the metrics flags, ``--grace-period`` / ``SMG_SERVICER_GRACE_PERIOD_S``,
    ``--metrics-port`` / ``SMG_SGLANG_SERVICER_METRICS_PORT``, ``--metrics-host`` / ``..._HOST``,
    the lane: ``--servicer-impl`` / ``SMG_SGLANG_SERVICER_IMPL`` (:mod:`.rust_lane`), and the
    folders adapters load from: ``--lora-allowed-dirs`` / ``SMG_SGLANG_SERVICER_LORA_ALLOWED_DIRS``
    (:mod:`.lora`)."""
    grace = next(s for s in SERVER_SETTINGS if s.name == "grace_period_s")
    return (
        grace,
        SHUTDOWN_MARGIN,
        *metrics_settings("sglang"),
        rust_lane.SERVICER_IMPL,
        rust_lane.DRAIN,
        lora.ALLOWED_DIRS,
    )


def traces_endpoint(server_args: Any) -> str:
    """SGLang's own ``--enable-trace`` / ``--otlp-traces-endpoint``: where request spans go
    (empty: tracing off)."""
    if not getattr(server_args, "enable_trace", False):
        return ""
    return str(getattr(server_args, "otlp_traces_endpoint", "") or "")


def resolve_settings(namespace: Any = None) -> ResolvedSettings:
    return resolve(servicer_settings(), namespace, environment())


async def run(
    server_args: Any,
    on_request_manager_ready: ReadyCallback | None = None,
    on_started: Callable[[int], None] | None = None,
    settings: ResolvedSettings | None = None,
) -> int:
    """Start, serve until a stop signal or scheduler death, stop. Returns the exit code.
    ``settings`` are the servicer's own (:func:`servicer_settings`; default: the environment)."""
    loop = asyncio.get_running_loop()
    quit_signal = _QuitSignal()
    try:
        own = settings if settings is not None else resolve_settings()
        check_metrics_port(own, int(server_args.port))
        if own[rust_lane.SERVICER_IMPL.name] == "rust":
            if on_request_manager_ready is not None:
                logger.warning("SGLang's HTTP sidecar is not started on the Rust lane")
            return rust_lane.run(server_args, own)
        logger.info(rust_lane.impl_line(own))
        # SGLang's own --ssl-* flags (ignored by SGLang in gRPC mode), else SMG_SERVICER_SSL_*.
        tls = resolve_tls(server_args, environment())
        tracing = start_tracing(traces_endpoint(server_args), "smg-servicer-sglang")
    except ConfigError as exc:
        logger.error("invalid configuration: %s", exc)
        return ExitCode.CONFIG
    try:
        started = await _start(server_args, quit_signal, own)
        if isinstance(started, int):
            return started
        return await _serve(
            started,
            server_args,
            own,
            on_request_manager_ready,
            on_started,
            tls=tls,
            tracing=tracing,
        )
    finally:
        loop.remove_signal_handler(signal.SIGQUIT)


async def _serve(
    schedulers: Schedulers,
    server_args: Any,
    own: ResolvedSettings,
    on_request_manager_ready: ReadyCallback | None,
    on_started: Callable[[int], None] | None,
    *,
    tls: ServerTls | None,
    tracing: Tracing | None,
) -> int:
    servicer = schedulers.servicer
    if on_request_manager_ready is not None:
        try:
            await on_request_manager_ready(
                schedulers.manager, server_args, schedulers.launched.scheduler_info
            )
        except Exception:
            logger.exception("on_request_manager_ready failed")
            await schedulers.shutdown()
            return ExitCode.ENGINE_DIED
    options = ServerOptions(
        host=str(servicer.config.host),
        port=int(servicer.config.port),
        grace_period_s=own["grace_period_s"],
        tls=tls,
        shutdown_margin_s=own["shutdown_margin_s"],
    )
    return await serve_servicer(
        servicer,
        [servicer.binding()],
        schedulers.health,
        schedulers,
        options,
        resolved=own,
        on_started=on_started,
        tracing=tracing,
        engine_metrics=_engine_metrics(schedulers.manager),
    )


def _engine_metrics(manager: RequestManager) -> EngineMetrics | None:
    """SGLang's own families for ``--metrics-port`` (with ``--enable-metrics``)."""
    if manager.metrics is None:
        return None
    return EngineMetrics(EngineFamilies("sglang:", multiprocess_folder()), "sglang")


async def serve_grpc(
    server_args: Any,
    model_info: dict[str, Any] | None = None,
    on_request_manager_ready: ReadyCallback | None = None,
) -> None:
    """SGLang's entry point. ``model_info`` is accepted for the launcher's signature and unused
    (model facts come from the model's config). Exits the process with 1 or 2 on failure."""
    del model_info
    code = await run(server_args, on_request_manager_ready)
    if code != 0:
        raise SystemExit(code)

"""``serve()``: one ``grpc.aio`` server for an engine servicer, with health, reflection and drain.

Lifecycle (exit codes in brackets)::

    bind -> health NOT_SERVING -> engine.wait_ready() -> SERVING
         -> SIGTERM/SIGINT (or stop_event)  -> NOT_SERVING, new calls UNAVAILABLE,
                                               in-flight calls drain up to the grace period,
                                               engine.shutdown()                          [0]
         -> the engine dies                 -> NOT_SERVING, calls cut, engine.shutdown()  [1]
         -> stopping outlasts grace + ``shutdown_margin_s`` -> engine processes killed    [1]
    a bad configuration or a port that cannot be bound raises ConfigError                [2]

With ``ServerOptions.tls`` the port speaks TLS only (:mod:`smg_servicer_core.tls`); with
``shutdown_margin_s`` set, stopping is bounded (:mod:`smg_servicer_core.shutdown`; launchers set
it, in-process test servers leave it off).

New calls during the drain are refused by :class:`DrainGate` with UNAVAILABLE (the router retries
that code on another worker), while ``grpc.health.v1`` and reflection keep answering so probes see
NOT_SERVING rather than a dead socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.gcheap import freeze_startup_heap
from smg_servicer_core.health import HEALTH_SERVICE_NAME, HealthFrame
from smg_servicer_core.shutdown import ShutdownDeadline
from smg_servicer_core.wire_guard import tolerant_add

if TYPE_CHECKING:
    from smg_servicer_core.metrics import MetricsServer
    from smg_servicer_core.tls import ServerTls

logger = logging.getLogger(__name__)

MiB = 1024 * 1024

#: Multimodal requests carry pixel tensors and the tokenizer bundle streams in 64 KiB chunks;
#: 256 MiB fits the largest preprocessed image batches the router sends.
DEFAULT_MAX_MESSAGE_BYTES = 256 * MiB
DEFAULT_GRACE_PERIOD_S = 30.0
DRAIN_POLL_S = 0.05


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Server channel options, each with its reason."""
    return [
        # Room for multimodal tensors in both directions.
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # Our own pings keep idle router connections alive through NATs and load balancers.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # The router (tonic) pings every 10 s on idle connections and between streams; without
        # these the server answers with GOAWAY "too_many_pings" and drops the connection.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
        # grpc enables SO_REUSEPORT by default: a second worker on the same port would bind
        # "successfully" and silently share the router's connections. Fail the bind instead.
        ("grpc.so_reuseport", 0),
        # Long streams must not be cut by connection ageing.
        ("grpc.max_connection_idle_ms", 2**31 - 1),
    ]


class EngineLifecycle(Protocol):
    """What ``serve()`` needs from an engine adapter."""

    async def wait_ready(self) -> None:
        """Return once the engine accepts requests; raise if it cannot start."""
        ...

    async def wait_dead(self) -> str:
        """Return (with a reason) only if the engine dies; otherwise wait forever."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and release its resources. Called once, at the end."""
        ...


class ExternalEngine:
    """The lifecycle of an engine built and stopped by someone else (vLLM's launcher, a test
    fixture): ready at once, never reported dead, nothing to shut down."""

    async def wait_ready(self) -> None:
        return None

    async def wait_dead(self) -> str:
        await asyncio.Event().wait()
        return ""  # pragma: no cover - never reached

    async def shutdown(self) -> None:
        return None


@dataclass(frozen=True)
class ServiceBinding:
    """An engine service to register: its full name and the generated ``add_*_to_server``."""

    full_name: str
    register: Callable[[grpc.aio.Server], None]


def bind_servicer(
    full_name: str, add_to_server: Callable[[Any, grpc.aio.Server], None], servicer: object
) -> ServiceBinding:
    """The binding for ``servicer`` with the generated ``add_<Service>Servicer_to_server``, its
    request parsing made tolerant (:mod:`smg_servicer_core.wire_guard`)."""
    add = tolerant_add(add_to_server)
    return ServiceBinding(full_name, lambda server: add(servicer, server))


@dataclass(frozen=True)
class ServerOptions:
    host: str = "0.0.0.0"
    port: int = 50051
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Serve TLS (mutual TLS with a client CA) instead of plain text.
    tls: ServerTls | None = None
    #: Stopping may take the grace period plus this long; then the engine's processes are
    #: killed and the process exits 1. None: unbounded (servers run inside a test process).
    shutdown_margin_s: float | None = None

    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class DrainGate(grpc.aio.ServerInterceptor):
    """Refuses new calls with UNAVAILABLE once closed; ``exempt`` services keep answering."""

    def __init__(self, exempt_prefixes: Sequence[str] = ()) -> None:
        self.closed = False
        self._exempt = tuple(exempt_prefixes)
        #: Called once per refused call (metrics: ``refused{reason="shutting_down"}``).
        self.on_refuse: Callable[[], None] | None = None

    async def intercept_service(  # pyright: ignore[reportIncompatibleMethodOverride]
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if not self.closed or handler is None or method.startswith(self._exempt):
            return handler
        if self.on_refuse is not None:
            self.on_refuse()
        return _refusing_handler(handler)


_SHUTTING_DOWN = "server is shutting down; retry on another worker"


def _refusing_handler(handler: _Handler) -> _Handler:
    async def refuse_unary(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, _SHUTTING_DOWN)

    async def refuse_stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, _SHUTTING_DOWN)
        yield  # pragma: no cover - makes this an async generator

    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse_unary, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse_unary, **kwargs)


class Server:
    """A bound ``grpc.aio`` server with health, reflection and a drain gate. Not yet started."""

    def __init__(
        self, bindings: Sequence[ServiceBinding], health: HealthFrame, options: ServerOptions
    ) -> None:
        self.options = options
        self.health = health
        self.gate = DrainGate(exempt_prefixes=(f"/{HEALTH_SERVICE_NAME}/", "/grpc.reflection."))
        self._server = grpc.aio.server(
            interceptors=[self.gate], options=channel_options(options.max_message_bytes)
        )
        for binding in bindings:
            binding.register(self._server)
        health_pb2_grpc.add_HealthServicer_to_server(health, self._server)  # pyright: ignore[reportUnknownMemberType]
        names = [b.full_name for b in bindings]
        reflection.enable_server_reflection(
            (*names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        try:
            if options.tls is None:
                self.port = self._server.add_insecure_port(options.address())
            else:
                self.port = self._server.add_secure_port(
                    options.address(), options.tls.credentials()
                )
        except RuntimeError as exc:
            raise ConfigError(f"cannot bind {options.address()}: {exc}") from exc
        if self.port == 0:
            raise ConfigError(f"cannot bind {options.address()}")

    async def start(self) -> None:
        await self._server.start()

    async def drain(self, grace_s: float, in_flight: Callable[[], int] | None = None) -> None:
        """NOT_SERVING, refuse new calls, let in-flight calls finish for up to ``grace_s``.

        While ``in_flight()`` is above zero the server keeps listening, so probes read
        NOT_SERVING and new calls get UNAVAILABLE from the gate (not a refused connection). Then
        the server stops, giving what is left of the grace period to calls still open.
        """
        self.health.enter_shutdown()
        self.gate.closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if in_flight is not None:
            # A counter owned by the servicer, polled: no event to wait on.
            while in_flight() > 0 and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(DRAIN_POLL_S)
        await self._server.stop(max(deadline - loop.time(), 0.0))


async def _first(*aws: Awaitable[Any]) -> tuple[int, Any]:
    """Wait for the first awaitable to finish; cancel the rest. Returns (index, result)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        index = next(i for i, t in enumerate(tasks) if t in done)
        return index, tasks[index].result()
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _signals_set(event: asyncio.Event, enabled: bool) -> Any:
    """SIGTERM/SIGINT set ``event`` for as long as the server drains and the engine shuts down:
    a repeated signal is logged and ignored, never the default action, which would kill the
    process mid-shutdown and leave the engine's processes behind."""
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT) if enabled else ()

    def on_signal(sig: signal.Signals) -> None:
        if event.is_set():
            logger.warning("%s again: already stopping (SIGKILL forces it)", sig.name)
        event.set()

    for sig in sigs:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


async def serve(
    bindings: Sequence[ServiceBinding],
    health: HealthFrame,
    engine: EngineLifecycle,
    options: ServerOptions,
    *,
    stop_event: asyncio.Event | None = None,
    handle_signals: bool = True,
    on_started: Callable[[int], None] | None = None,
    in_flight: Callable[[], int] | None = None,
    metrics_server: MetricsServer | None = None,
) -> int:
    """Run until a stop signal or engine death. Returns the process exit code (0 or 1).

    ``in_flight`` (for example ``lambda: len(servicer.registry)``) lets the drain end as soon as
    the last request finishes instead of waiting for the connection-level stop.
    ``metrics_server`` (already listening) counts the drain's refusals and is closed at the end.
    """
    stop = stop_event or asyncio.Event()
    try:
        server = Server(bindings, health, options)
        if metrics_server is not None:
            metrics = metrics_server.metrics
            server.gate.on_refuse = lambda: metrics.refuse("shutting_down")
        return await _serve(
            server,
            health=health,
            engine=engine,
            options=options,
            stop=stop,
            handle_signals=handle_signals,
            on_started=on_started,
            in_flight=in_flight,
        )
    finally:
        if metrics_server is not None:
            metrics_server.close()


async def _serve(
    server: Server,
    *,
    health: HealthFrame,
    engine: EngineLifecycle,
    options: ServerOptions,
    stop: asyncio.Event,
    handle_signals: bool,
    on_started: Callable[[int], None] | None,
    in_flight: Callable[[], int] | None,
) -> int:
    code = ExitCode.OK
    deadline = (
        ShutdownDeadline(options.grace_period_s, options.shutdown_margin_s)
        if options.shutdown_margin_s is not None
        else None
    )
    # The handlers go in before the port is announced: a SIGTERM right after the announcement
    # (a supervisor that saw the port) drains instead of killing the process with -15.
    with _signals_set(stop, handle_signals):
        await server.start()
        security = options.tls.describe() if options.tls is not None else "plain text"
        logger.info("listening on %s (port %d, %s)", options.address(), server.port, security)
        if on_started is not None:
            on_started(server.port)
        try:
            which, result = await _first(engine.wait_ready(), stop.wait(), engine.wait_dead())
        except Exception as exc:  # the engine could not start
            logger.exception("engine failed to start")
            which, result = 2, f"start-up failed: {type(exc).__name__}"
        if which == 0:
            freeze_startup_heap()
            health.set_serving()
            logger.info("engine ready; SERVING")
            which, result = await _first(stop.wait(), engine.wait_dead())
            which += 1  # align with the first wait: 1 = stop, 2 = dead
        if which == 2:
            logger.error("engine died: %s", result)
            code = ExitCode.ENGINE_DIED
            if deadline is not None:
                deadline.arm(grace_s=0.0)
            await server.drain(0)
        else:
            logger.info("stopping: draining for up to %.1fs", options.grace_period_s)
            if deadline is not None:
                deadline.arm()
            await server.drain(options.grace_period_s, in_flight)
        await engine.shutdown()
        if deadline is not None:
            deadline.disarm()
    logger.info("stopped (exit %d)", code)
    return int(code)

"""One trace from the router to the worker: a span per ``Generate`` that continues the caller's
W3C trace context.

The router (``smg launch --enable-trace``) sends ``traceparent`` / ``tracestate`` in the gRPC
metadata of each worker call, its ``grpc_execute`` span as the parent. With tracing on
(:func:`start_tracing`: an OTLP gRPC endpoint), each ``Generate`` that carries that context gets
one span, ``llm_request`` (kind SERVER), a child of the router's span, exported over OTLP gRPC by
a batching processor (bounded queue, flushed at exit). Its attributes use the names vLLM's own
tracing gives them (``gen_ai.*``):

| attribute | value |
|---|---|
| ``gen_ai.request.id`` | the request's id |
| ``gen_ai.request.max_tokens`` / ``temperature`` / ``top_p`` / ``n`` | when the request sets them |
| ``gen_ai.latency.time_to_first_token`` | call start to the first message (s) |
| ``gen_ai.latency.e2e`` | call start to its end (s) |
| ``gen_ai.usage.prompt_tokens`` / ``completion_tokens`` | from the ``complete`` messages |
| ``gen_ai.response.finish_reasons`` | each choice's finish reason |
| ``rpc.grpc.status_code`` | the call's status (the span's status is ERROR unless OK) |

and one event, ``first_token``, when the first message goes out. A call without trace context
makes no span: the only cost is one scan of its metadata, and none at all with tracing off (the
default: :meth:`~smg_servicer_core.servicer.EngineServicer.attach_tracing` never called).

The OpenTelemetry SDK and its OTLP exporter are optional (``smg-servicer-core[tracing]``): asking
for tracing without them is a configuration error (exit 2) that names the install line.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Iterable
from typing import Any

from smg_servicer_core.config import Setting
from smg_servicer_core.errors import ConfigError

logger = logging.getLogger(__name__)

#: The W3C trace-context keys a caller's metadata may carry.
TRACE_KEYS = ("traceparent", "tracestate")
SPAN_NAME = "llm_request"
INSTALL = "pip install 'smg-servicer-core[tracing]'"
#: The exporter's queue (spans waiting to be sent): beyond it, spans are dropped, not held.
MAX_QUEUE = 2048
#: Seconds the exit may spend sending what is queued.
FLUSH_AT_EXIT_S = 5.0


def trace_headers(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str] | None:
    """The caller's W3C trace context from gRPC metadata (None when it sent none)."""
    found = {str(k): str(v) for k, v in (metadata or ()) if k in TRACE_KEYS}
    return found or None


def tracing_setting(engine: str) -> Setting[str]:
    """``--otlp-traces-endpoint`` / ``SMG_<ENGINE>_SERVICER_OTLP_TRACES_ENDPOINT`` (vLLM's flag
    name): where spans go, ``host:port`` of an OTLP gRPC collector; off when empty."""
    return Setting(
        "otlp_traces_endpoint",
        str,
        "",
        "OTLP gRPC collector (host:port) for request spans that continue the caller's trace "
        "(off when empty)",
        flag="--otlp-traces-endpoint",
        env=f"SMG_{engine.upper()}_SERVICER_OTLP_TRACES_ENDPOINT",
    )


def _sampling_attributes(request: Any) -> dict[str, Any]:
    params = getattr(request, "sampling_params", None)
    out: dict[str, Any] = {}
    if params is None:
        return out
    for attribute, fields in (
        ("gen_ai.request.max_tokens", ("max_tokens", "max_new_tokens")),
        ("gen_ai.request.temperature", ("temperature",)),
        ("gen_ai.request.top_p", ("top_p",)),
        ("gen_ai.request.n", ("n",)),
    ):
        for field in fields:
            value = getattr(params, field, None)
            if value:  # proto3: 0 and unset read alike; vLLM's tracing leaves those out too
                out[attribute] = value
                break
    return out


class RequestSpan:
    """One ``Generate`` call's span: ``message`` per response sent, ``done`` with its status."""

    __slots__ = ("completion_tokens", "finish_reasons", "first", "prompt_tokens", "span", "start")

    def __init__(self, span: Any, start: float) -> None:
        self.span = span
        self.start = start
        self.first = 0.0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reasons: list[str] = []

    def message(self, item: Any) -> None:
        if not self.first:
            self.first = time.perf_counter()
            self.span.add_event("first_token")
        if item.HasField("complete"):
            complete = item.complete
            self.prompt_tokens = max(self.prompt_tokens, complete.prompt_tokens)
            self.completion_tokens += complete.completion_tokens
            if complete.finish_reason:
                self.finish_reasons.append(complete.finish_reason)

    def done(self, code: str) -> None:
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415 - optional SDK

        span = self.span
        now = time.perf_counter()
        attributes: dict[str, Any] = {
            "gen_ai.latency.e2e": now - self.start,
            "rpc.grpc.status_code": code,
        }
        if self.first:
            attributes["gen_ai.latency.time_to_first_token"] = self.first - self.start
        if self.prompt_tokens:
            attributes["gen_ai.usage.prompt_tokens"] = self.prompt_tokens
        if self.finish_reasons:
            attributes["gen_ai.usage.completion_tokens"] = self.completion_tokens
            attributes["gen_ai.response.finish_reasons"] = self.finish_reasons
        span.set_attributes(attributes)
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()


class Tracing:
    """Request spans exported to ``endpoint`` (an OTLP gRPC collector, ``host:port``) as
    ``service_name``. ``exporter``: another span exporter (tests)."""

    def __init__(self, endpoint: str, service_name: str, *, exporter: Any = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - optional SDK
            from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
            from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
            from opentelemetry.trace import SpanKind  # noqa: PLC0415
            from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
                TraceContextTextMapPropagator,
            )

            if exporter is None:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
                    OTLPSpanExporter,
                )

                exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
        except ImportError as exc:
            raise ConfigError(
                f"--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter "
                f"({type(exc).__name__}: {exc.name or 'a module'} is missing): {INSTALL}"
            ) from None
        self.endpoint = endpoint
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=MAX_QUEUE))
        self.tracer = self.provider.get_tracer("smg_servicer_core.tracing")
        self.propagator = TraceContextTextMapPropagator()
        self.kind = SpanKind.SERVER
        atexit.register(self.shutdown)

    def start(self, request: Any, metadata: Iterable[tuple[str, Any]] | None) -> RequestSpan | None:
        """The span of one ``Generate`` call, or None when the caller sent no trace context."""
        headers = trace_headers(metadata)
        if headers is None:
            return None
        parent = self.propagator.extract(carrier=headers)
        attributes = {
            "gen_ai.request.id": str(getattr(request, "request_id", "")),
            **(_sampling_attributes(request)),
        }
        span = self.tracer.start_span(
            SPAN_NAME, context=parent, kind=self.kind, attributes=attributes
        )
        return RequestSpan(span, time.perf_counter())

    def shutdown(self) -> None:
        """Send what is queued (bounded by :data:`FLUSH_AT_EXIT_S`) and stop exporting."""
        try:
            self.provider.force_flush(int(FLUSH_AT_EXIT_S * 1000))
            self.provider.shutdown()
        except Exception as exc:  # at exit: say what, never raise
            logger.warning("request spans not flushed at exit (%s)", type(exc).__name__)


def start_tracing(endpoint: str, service_name: str) -> Tracing | None:
    """A :class:`Tracing` to ``endpoint``, or None when it is empty (tracing off). A missing SDK
    raises :class:`~smg_servicer_core.errors.ConfigError` (exit 2 at start)."""
    if not endpoint:
        return None
    tracing = Tracing(endpoint, service_name)
    logger.info("request spans continue the caller's trace, exported to %s", endpoint)
    return tracing

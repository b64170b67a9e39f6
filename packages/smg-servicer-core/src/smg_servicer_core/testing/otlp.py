"""An OTLP trace collector for tests: OpenTelemetry's own ``TraceService`` over gRPC (the wire the
router's and the engines' exporters speak), bound to 127.0.0.1, keeping what it receives.

    with OtlpReceiver() as receiver:               # receiver.endpoint: "127.0.0.1:PORT"
        ...                                        # point the router and the worker at it
        span = receiver.wait_for(lambda s: s.name == "llm_request", timeout_s=30)

Built on ``opentelemetry-proto`` (``smg-servicer-core[tracing]``). Keeps at most
:data:`MAX_SPANS` spans (the oldest go first: a router exports a span for every probe); every wait
is bounded.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import (  # pyright: ignore[reportMissingTypeStubs]
    trace_service_pb2,
    trace_service_pb2_grpc,
)

MAX_SPANS = 20_000


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it (ids as lowercase hex; no parent: ``""``)."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict[str, Any])
    events: tuple[str, ...] = ()
    status_code: int = 0


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        spans: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                spans.extend(
                    ReceivedSpan(
                        service=service,
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        events=tuple(e.name for e in s.events),
                        status_code=s.status.code,
                    )
                    for s in scope_spans.spans
                )
        self.receiver.add(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """The collector: ``with`` starts it on a free loopback port and stops it."""

    def __init__(self) -> None:
        self._spans: deque[ReceivedSpan] = deque(maxlen=MAX_SPANS)
        self._changed = threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add: Any = trace_service_pb2_grpc.add_TraceServiceServicer_to_server  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        add(_Service(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._changed.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        with self._changed:
            return list(self._spans)

    def wait_for(
        self, match: Callable[[ReceivedSpan], bool], timeout_s: float = 30.0
    ) -> ReceivedSpan:
        """The first span received that ``match``es, waiting for it up to ``timeout_s``
        (TimeoutError, naming what did arrive)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = next((s for s in self._spans if match(s)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({(s.service, s.name) for s in self._spans})
                    raise TimeoutError(f"no matching span within {timeout_s} s; received {names}")
                self._changed.wait(left)

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.stop(grace=None)

"""Request spans that continue the caller's trace: exported over OTLP gRPC to a real collector
(:class:`~smg_servicer_core.testing.otlp.OtlpReceiver`), children of the caller's span, none
for a call that carries no trace context, the flag and its variable, a missing SDK."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import grpc
import pytest

from smg_servicer_core.cli import resolve_server, server_parser, tracing_from
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.metrics import ServicerMetrics
from smg_servicer_core.testing.otlp import OtlpReceiver, ReceivedSpan
from smg_servicer_core.testing.requests import mlx_generate
from smg_servicer_core.tracing import SPAN_NAME, Tracing, trace_headers

from .conftest import Stack

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = (("traceparent", f"00-{TRACE_ID}-{PARENT}-01"), ("tracestate", "vendor=1"))


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def _span_of(receiver: OtlpReceiver, request_id: str) -> ReceivedSpan:
    return receiver.wait_for(lambda s: s.attributes.get("gen_ai.request.id") == request_id)


@pytest.mark.unit
async def test_a_traced_generate_is_a_child_of_the_callers_span(
    stack: Stack, receiver: OtlpReceiver
) -> None:
    """Streamed and unary calls with trace context each make one ``llm_request`` span in the
    caller's trace, its parent the caller's span, with vLLM's ``gen_ai.*`` names; a call
    without context makes none; a refused call's span is an error. Metrics and tracing on
    together both see every call."""
    tracing = Tracing(receiver.endpoint, "smg-servicer-test")
    stack.servicer.attach_tracing(tracing)
    metrics = ServicerMetrics()
    stack.servicer.attach_metrics(metrics)

    untraced = mlx_generate([1, 2, 3], max_tokens=4, request_id="untraced")
    [reply] = [r async for r in stack.stub.Generate(untraced)]
    streamed = mlx_generate([1, 2, 3], max_tokens=5, stream=True, request_id="streamed")
    chunks = [r async for r in stack.stub.Generate(streamed, metadata=TRACEPARENT)]
    unary = mlx_generate([4, 5], max_tokens=3, request_id="unary", temperature=0.5)
    [single] = [r async for r in stack.stub.Generate(unary, metadata=TRACEPARENT)]
    refused = mlx_generate([], max_tokens=3, request_id="refused")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stack.stub.Generate(refused, metadata=TRACEPARENT)]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    tracing.provider.force_flush()

    span = _span_of(receiver, "streamed")
    assert (span.name, span.service, span.trace_id, span.parent_span_id) == (
        SPAN_NAME,
        "smg-servicer-test",
        TRACE_ID,
        PARENT,
    )
    assert span.kind == 2  # SPAN_KIND_SERVER
    complete = chunks[-1].complete
    assert span.attributes["gen_ai.usage.prompt_tokens"] == complete.prompt_tokens == 3
    assert span.attributes["gen_ai.usage.completion_tokens"] == complete.completion_tokens == 5
    assert span.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert span.attributes["gen_ai.request.max_tokens"] == 5
    assert span.events == ("first_token",)
    assert span.attributes["gen_ai.latency.time_to_first_token"] > 0
    assert (
        span.attributes["gen_ai.latency.time_to_first_token"]
        <= span.attributes["gen_ai.latency.e2e"]
    )
    assert (span.attributes["rpc.grpc.status_code"], span.status_code) == ("OK", 0)

    one = _span_of(receiver, "unary")
    assert one.attributes["gen_ai.usage.completion_tokens"] == len(single.complete.output_ids)
    assert one.attributes["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert one.trace_id == TRACE_ID

    bad = _span_of(receiver, "refused")
    assert (bad.attributes["rpc.grpc.status_code"], bad.status_code) == ("INVALID_ARGUMENT", 2)
    assert bad.events == ()

    # The untraced call ended first; its span, had it made one, went out no later than these.
    ids = [s.attributes.get("gen_ai.request.id") for s in receiver.spans()]
    assert "untraced" not in ids
    assert reply.complete.completion_tokens == 4
    assert metrics.rpc_requests[("Generate", "OK")] == 3
    assert metrics.rpc_requests[("Generate", "INVALID_ARGUMENT")] == 1


@pytest.mark.unit
def test_trace_headers_are_the_w3c_keys_only() -> None:
    assert trace_headers([("traceparent", "00-a-b-01"), ("user-agent", "tonic")]) == {
        "traceparent": "00-a-b-01"
    }
    assert trace_headers([("user-agent", "tonic/0.14.6")]) is None
    assert trace_headers(None) is None


@pytest.mark.unit
def test_the_flag_and_its_variable_turn_tracing_on() -> None:
    parser = server_parser("mlx")
    off = resolve_server(parser.parse_args([]), {}, "mlx")
    assert tracing_from(off, "x") is None
    by_flag = resolve_server(
        parser.parse_args(["--otlp-traces-endpoint", "127.0.0.1:4317"]), {}, "mlx"
    )
    assert by_flag["otlp_traces_endpoint"] == "127.0.0.1:4317"
    by_env = resolve_server(
        parser.parse_args([]), {"SMG_MLX_SERVICER_OTLP_TRACES_ENDPOINT": "h:1"}, "mlx"
    )
    assert (by_env["otlp_traces_endpoint"], by_env.source("otlp_traces_endpoint")) == (
        "h:1",
        "env",
    )


@pytest.mark.unit
def test_tracing_without_the_sdk_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigError, match=r"smg-servicer-core\[tracing\]"):
        Tracing("127.0.0.1:4317", "x")

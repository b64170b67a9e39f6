"""Bytes that are not the request message: INVALID_ARGUMENT with a plain message on every RPC kind
(found by the reliability suite's malformed-bytes fuzz: grpcio answered UNKNOWN with the parser's
exception text)."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as pb

from smg_servicer_core.testing import mlx_generate
from smg_servicer_core.testing.fake_servicer import SERVICE_NAME
from smg_servicer_core.wire_guard import MalformedRequest, tolerant_add, tolerant_deserializer

pytestmark = pytest.mark.contract

CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, a length far past the end


@pytest.mark.parametrize(
    ("method", "kind", "message"),
    [
        ("Generate", "unary_stream", "GenerateRequest"),
        ("GetModelInfo", "unary_unary", "GetModelInfoRequest"),
        ("Abort", "unary_unary", "AbortRequest"),
    ],
)
async def test_corrupt_bytes_are_invalid_argument_naming_the_message(
    stack, method: str, kind: str, message: str
) -> None:
    call = getattr(stack.server.channel, kind)(f"/{SERVICE_NAME}/{method}")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if kind == "unary_stream":
            async for _ in call(CORRUPT):
                pass
        else:
            await call(CORRUPT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == f"the request is not a valid {message} message"


async def test_the_server_still_serves_and_counts_the_refusal(stack) -> None:
    raw = stack.server.channel.unary_stream(f"/{SERVICE_NAME}/Generate")
    with pytest.raises(grpc.aio.AioRpcError):
        async for _ in raw(CORRUPT):
            pass
    replies = [r async for r in stack.stub.Generate(mlx_generate([1, 2], max_tokens=2))]
    assert replies[-1].complete.completion_tokens == 2
    assert len(stack.servicer.registry) == 0


@pytest.mark.unit
def test_a_tolerant_deserializer_passes_good_bytes_and_names_bad_ones() -> None:
    parse = tolerant_deserializer(pb.GenerateRequest.FromString)
    good = pb.GenerateRequest(request_id="r")
    assert parse(good.SerializeToString()) == good
    bad = parse(CORRUPT)
    assert isinstance(bad, MalformedRequest)
    assert bad.message == "the request is not a valid GenerateRequest message"


@pytest.mark.unit
def test_tolerant_add_wraps_once() -> None:
    def add(servicer: object, server: object) -> None: ...

    once = tolerant_add(add)
    assert tolerant_add(once) is once

"""Generate / Abort / info RPCs of the fake servicer: stream order, abort paths, exact counts."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as pb

from smg_servicer_core.testing import FakeScript, mlx_generate
from smg_servicer_core.testing.fake_engine import FakeEngine, derived_token


async def _read_all(call) -> list[pb.GenerateResponse]:
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


async def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.contract
async def test_stream_is_chunks_then_one_complete(stack) -> None:
    prompt = [7, 8, 9]
    responses = await _read_all(
        stack.stub.Generate(mlx_generate(prompt, stream=True, max_tokens=5))
    )
    kinds = [r.WhichOneof("response") for r in responses]
    # The engine costs nothing, so the stream may be behind it: several tokens per chunk.
    assert kinds == ["chunk"] * (len(kinds) - 1) + ["complete"]
    ids = [t for r in responses[:-1] for t in r.chunk.token_ids]
    assert ids == [derived_token(prompt, i, stack.engine.vocab_size) for i in range(5)]
    assert [r.chunk.completion_tokens for r in responses[:-1]] == list(
        itertools.accumulate(len(r.chunk.token_ids) for r in responses[:-1])
    )
    complete = responses[-1].complete
    assert (complete.finish_reason, complete.prompt_tokens, complete.completion_tokens) == (
        "length",
        3,
        5,
    )


@pytest.mark.contract
async def test_without_coalescing_each_step_is_a_chunk(stack) -> None:
    stack.engine.coalesce = False
    responses = await _read_all(stack.stub.Generate(mlx_generate([7], stream=True, max_tokens=9)))
    assert [len(r.chunk.token_ids) for r in responses[:-1]] == [1] * 9
    assert responses[-1].complete.completion_tokens == 9


@pytest.mark.contract
async def test_a_stream_that_keeps_up_gets_each_token_at_once(stack) -> None:
    """Coalescing never holds a token back: with the engine slower than gRPC (20 ms a step),
    every chunk carries one token."""
    stack.engine.default_script = FakeScript(token_delay_s=0.02)
    responses = await _read_all(stack.stub.Generate(mlx_generate([7], stream=True, max_tokens=6)))
    assert [len(r.chunk.token_ids) for r in responses[:-1]] == [1] * 6


@pytest.mark.contract
async def test_a_lagging_reader_gets_what_it_missed_in_one_output() -> None:
    engine = FakeEngine()
    stream = engine.generate("lag", [3, 4], max_tokens=10)
    first = await anext(stream)
    await asyncio.sleep(0.05)  # the reader falls behind; the engine keeps stepping
    rest = [output async for output in stream]
    assert len(first.token_ids) == 1
    assert [len(o.token_ids) for o in rest] == [9]
    assert rest[-1].finish_reason == "length"


@pytest.mark.contract
async def test_non_stream_returns_all_ids_and_stop_token(stack) -> None:
    stack.engine.default_script = FakeScript(tokens=[10, 11, 12, 13])
    responses = await _read_all(
        stack.stub.Generate(mlx_generate([1], max_tokens=10, stop_token_ids=[12]))
    )
    assert len(responses) == 1
    complete = responses[0].complete
    assert list(complete.output_ids) == [10, 11, 12]
    assert complete.finish_reason == "stop"
    assert complete.matched_stop_token_id == 12


@pytest.mark.contract
async def test_abort_rpc_mid_stream_stops_the_engine(stack) -> None:
    stack.engine.default_script = FakeScript(token_delay_s=0.02)
    call = stack.stub.Generate(
        mlx_generate([1, 2], stream=True, max_tokens=1000, request_id="victim")
    )
    await call.read()
    info = await stack.stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.active_requests == 1
    await stack.stub.Abort(pb.AbortRequest(request_ids=["victim", "unknown-id"]))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await _read_all(call)
    assert ended.value.code() == grpc.StatusCode.ABORTED  # a clear end, not a silent truncation
    produced = stack.engine.produced["victim"]
    await asyncio.sleep(0.1)
    assert stack.engine.produced["victim"] == produced, "engine kept producing after abort"
    assert stack.engine.abort_calls["victim"] == 1
    assert "unknown-id" not in stack.engine.abort_calls
    info = await stack.stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.active_requests == 0


@pytest.mark.contract
async def test_client_cancel_aborts_in_engine_once(stack) -> None:
    stack.engine.default_script = FakeScript(token_delay_s=0.02)
    call = stack.stub.Generate(
        mlx_generate([1, 2], stream=True, max_tokens=1000, request_id="leaver")
    )
    await call.read()
    call.cancel()
    await _wait_for(lambda: len(stack.servicer.registry) == 0)
    assert stack.engine.abort_calls["leaver"] == 1
    assert "leaver" not in stack.engine.running


@pytest.mark.contract
@pytest.mark.parametrize(
    "request_",
    [
        mlx_generate([]),
        mlx_generate([4096]),
        mlx_generate(list(range(2048))),
        pb.GenerateRequest(request_id="t", text="hello"),
    ],
    ids=["empty", "id-over-vocab", "over-context", "text-input"],
)
async def test_bad_input_is_invalid_argument_and_server_stays_healthy(stack, request_) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _read_all(stack.stub.Generate(request_))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    health = await stack.stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy


@pytest.mark.contract
async def test_duplicate_in_flight_id_is_already_exists(stack) -> None:
    stack.engine.default_script = FakeScript(token_delay_s=0.02)
    first = stack.stub.Generate(mlx_generate([1], stream=True, max_tokens=100, request_id="dup"))
    await first.read()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _read_all(stack.stub.Generate(mlx_generate([1], request_id="dup")))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    first.cancel()


@pytest.mark.contract
async def test_thirty_two_concurrent_streams_have_exact_counts(stack) -> None:
    async def one(i: int) -> tuple[int, int]:
        responses = await _read_all(
            stack.stub.Generate(mlx_generate([i + 1], stream=True, max_tokens=20 + i))
        )
        streamed = sum(len(r.chunk.token_ids) for r in responses[:-1])
        return streamed, responses[-1].complete.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(32)))
    assert results == [(20 + i, 20 + i) for i in range(32)]
    assert len(stack.servicer.registry) == 0


@pytest.mark.contract
async def test_health_check_and_model_info(stack) -> None:
    health = await stack.stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy
    info = await stack.stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.vocab_size == 4096 and list(info.eos_token_ids) == [2, 0]
    server = await stack.stub.GetServerInfo(pb.GetServerInfoRequest())
    assert server.server_type == "fake-grpc" and server.uptime_seconds > 0


@pytest.mark.contract
async def test_reflection_lists_engine_health_and_reflection(stack) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub: Any = reflection_pb2_grpc.ServerReflectionStub(stack.server.channel)
    call = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    [response] = [r async for r in call]
    names = {s.name for s in response.list_services_response.service}
    assert names == {
        "mlx.grpc.engine.MlxEngine",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }


@pytest.mark.contract
async def test_the_shared_bad_requests_are_refused_with_their_messages(stack) -> None:
    from smg_servicer_core.testing.bad_requests import assert_refused_alike

    engine = stack.engine
    ran = await assert_refused_alike(
        stack.stub, "mlx", vocab_size=engine.vocab_size, context_length=engine.max_context
    )
    assert ran == 11

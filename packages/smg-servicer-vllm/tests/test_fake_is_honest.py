"""The same contract checks against the fake AsyncLLM and the real one: the fake (used by the
servicer-cost benchmark) behaves like the engine where the servicer can tell."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request

pytestmark = [pytest.mark.contract, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(params=["fake_stack", "vllm_stack"])
def stack(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    return request.getfixturevalue(request.param)


async def read_all(call: Any) -> list[pb.GenerateResponse]:
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


async def test_stream_shape_for_n2(stack: tuple[Any, Any]) -> None:
    _, stub = stack
    responses = await read_all(
        stub.Generate(
            generate_request(
                "vllm",
                [1, 2, 3],
                max_tokens=5,
                n=2,
                temperature=1.0,
                seed=1,
                ignore_eos=True,
                stream=True,
            )
        )
    )
    for index in (0, 1):
        mine = [
            r
            for r in responses
            if (r.chunk.index if r.HasField("chunk") else r.complete.index) == index
        ]
        kinds = [r.WhichOneof("response") for r in mine]
        # One chunk per token, except where the stream fell behind the engine: then the waiting
        # outputs go out as one chunk (adaptive coalescing), as a loaded machine shows.
        assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}, kinds
        assert all(r.chunk.completion_tokens == len(r.chunk.token_ids) >= 1 for r in mine[:-1])
        assert sum(len(r.chunk.token_ids) for r in mine[:-1]) == 5
        assert mine[-1].complete.completion_tokens == 5
        assert mine[-1].complete.finish_reason == "length"
        assert list(mine[-1].complete.output_ids) == list(mine[-2].chunk.token_ids)


async def test_abort_ends_with_an_abort_complete(stack: tuple[Any, Any]) -> None:
    servicer, stub = stack
    rid = f"honest-{type(servicer.engine).__name__}"
    call = stub.Generate(
        generate_request(
            "vllm", [1, 2, 3], max_tokens=900, ignore_eos=True, stream=True, request_id=rid
        )
    )
    await call.read()
    await stub.Abort(pb.AbortRequest(request_ids=[rid]))
    rest = await read_all(call)
    assert rest[-1].complete.finish_reason == "abort"
    assert len(servicer.registry) == 0
    assert servicer.engine.output_processor.get_num_unfinished_requests() == 0


async def test_loads_report_the_one_managed_rank_and_refuse_another(
    stack: tuple[Any, Any],
) -> None:
    """One DP rank: after a request, GetLoads has that rank's entry from the engine's own stat
    loggers (capacity as the engine sizes it) and refuses a rank it does not manage, alike on
    the fake and on vLLM."""
    _, stub = stack
    await read_all(stub.Generate(generate_request("vllm", [4, 5, 6], max_tokens=3, stream=True)))
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    assert [load.dp_rank for load in loads.loads] == [0] and loads.dp_rank_count == 1
    (load,) = loads.loads
    assert load.max_total_num_tokens > 0 and 0.0 <= load.token_usage <= 1.0
    assert load.num_total_reqs == load.num_running_reqs + load.num_waiting_reqs
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.GetLoads(pb.GetLoadsRequest(dp_rank=3))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "DP rank 3 is not managed by this engine"


async def test_is_paused_follows_the_engines_own_pause(stack: tuple[Any, Any]) -> None:
    """GetServerInfo's ``is_paused`` is the engine's: True after its own ``pause_generation``,
    False again after ``resume_generation``, alike on the fake and on vLLM. The structured
    outputs config runs no reasoning parser here: the grammar runs from the first token."""
    servicer, stub = stack
    before = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert not before.is_paused
    await servicer.engine.pause_generation(mode="keep", clear_cache=False)
    try:
        assert (await stub.GetServerInfo(pb.GetServerInfoRequest())).is_paused
    finally:
        await servicer.engine.resume_generation()
    assert not (await stub.GetServerInfo(pb.GetServerInfoRequest())).is_paused
    assert before.engine_reasoning_parser == ""

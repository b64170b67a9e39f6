"""The servicer on the real SGLang scheduler (CPU, float32 tiny model), through SGLang's own
launcher: outputs equal ``sglang.Engine``'s, and every RPC behaves as the proto says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.sglang_reference import CASES, MAX_TOKENS, TOP
from smg_it.sglang_suite import SERVICE, Server
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]
VOCAB = 4096


@pytest_asyncio.fixture(loop_scope="session")
async def stub(sglang_server: Server) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(sglang_server.address) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


_counter = iter(range(1_000_000))


def request(ids: list[int], **kwargs: Any) -> pb.GenerateRequest:
    sampling = kwargs.pop("sampling", {})
    return pb.GenerateRequest(
        request_id=f"t-{next(_counter)}",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(
            **({"temperature": 0.0, "max_new_tokens": MAX_TOKENS} | sampling)
        ),
        **kwargs,
    )


async def collect(stub: Any, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [r async for r in stub.Generate(req)]


async def read_rest(call: Any) -> list[pb.GenerateResponse]:
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    return rest


def stream_ids(responses: list[pb.GenerateResponse], index: int = 0) -> list[int]:
    return [t for r in responses if r.HasField("chunk") and r.chunk.index == index
            for t in r.chunk.token_ids]  # fmt: skip


def completes(responses: list[pb.GenerateResponse]) -> list[pb.GenerateComplete]:
    return [r.complete for r in responses if r.HasField("complete")]


async def scheduler_running(stub: Any) -> int:
    loads = await stub.GetLoads(pb.GetLoadsRequest(include=["core"]))
    return sum(load.num_running_reqs + load.num_waiting_reqs for load in loads.loads)


async def wait_idle(stub: Any, timeout_s: float = 10.0) -> None:
    """Until the scheduler reports no running or waiting request (its own load snapshot)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await scheduler_running(stub) == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the scheduler still has requests")


@pytest.mark.parametrize("name", sorted(CASES))
async def test_greedy_ids_equal_engine_non_stream(stub: Any, reference: Any, name: str) -> None:
    responses = await collect(stub, request(CASES[name]))
    (complete,) = completes(responses)
    assert list(complete.output_ids) == reference[name]["ids"]
    assert complete.finish_reason == reference[name]["finish"] == "length"
    assert complete.prompt_tokens == len(CASES[name])
    assert complete.completion_tokens == MAX_TOKENS


@pytest.mark.parametrize("name", sorted(CASES))
async def test_greedy_ids_equal_engine_stream(stub: Any, reference: Any, name: str) -> None:
    responses = await collect(stub, request(CASES[name], stream=True))
    assert stream_ids(responses) == reference[name]["ids"]
    assert responses[-1].HasField("complete"), "a stream always ends with complete"
    complete = responses[-1].complete
    assert complete.finish_reason == "length"
    assert complete.completion_tokens == MAX_TOKENS
    assert complete.prompt_tokens == len(CASES[name])
    assert all(r.request_id == responses[0].request_id for r in responses)
    # The router counts streamed tokens; every chunk is a delta of at least one token.
    assert all(len(r.chunk.token_ids) >= 1 for r in responses if r.HasField("chunk"))


@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_equal_engine(stub: Any, reference: Any, stream: bool) -> None:
    want = reference["other"]
    req = request(CASES["other"], stream=stream, return_logprob=True, top_logprobs_num=TOP)
    responses = await collect(stub, req)
    if stream:
        parts = [r.chunk.output_logprobs for r in responses if r.HasField("chunk")]
    else:
        parts = [completes(responses)[0].output_logprobs]
    values = [v for p in parts for v in p.token_logprobs]
    ids = [t for p in parts for t in p.token_ids]
    tops = [row for p in parts for row in p.top_logprobs]
    assert ids == want["ids"]
    assert values == pytest.approx(want["logprobs"], abs=1e-5)
    assert len(tops) == len(want["top"])
    for row, expected in zip(tops, want["top"], strict=True):
        assert list(row.token_ids) == [tid for _, tid in expected]
        assert list(row.values) == pytest.approx([lp for lp, _ in expected], abs=1e-5)


async def test_prompt_logprobs_from_position(stub: Any) -> None:
    ids = CASES["other"]
    req = request(ids, return_logprob=True, logprob_start_len=2, top_logprobs_num=1)
    (complete,) = completes(await collect(stub, req))
    prompt = complete.input_logprobs
    assert list(prompt.token_ids) == ids[2:]
    assert len(prompt.token_logprobs) == len(ids) - 2


async def test_n3_returns_three_choices(stub: Any) -> None:
    sampling = {"n": 3, "temperature": 1.0, "max_new_tokens": 6, "ignore_eos": True}
    for stream in (False, True):
        responses = await collect(stub, request(CASES["short"], stream=stream, sampling=sampling))
        finals = completes(responses)
        assert sorted(c.index for c in finals) == [0, 1, 2]
        assert all(c.completion_tokens == 6 for c in finals)
        if stream:
            assert all(len(stream_ids(responses, i)) == 6 for i in range(3))
        else:
            assert all(len(c.output_ids) == 6 for c in finals)
    await wait_idle(stub)


async def test_stop_token_reports_match(stub: Any, reference: Any) -> None:
    want = reference["short"]["ids"]
    stop = want[3]
    req = request(CASES["short"], sampling={"stop_token_ids": [stop]})
    (complete,) = completes(await collect(stub, req))
    assert complete.finish_reason == "stop"
    assert complete.matched_token_id == stop
    assert list(complete.output_ids) == want[: want.index(stop) + 1]


async def test_json_schema_output_validates(stub: Any) -> None:
    schema = {
        "type": "object",
        # A finite grammar: a random model could otherwise write digits until max_new_tokens.
        "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
        "required": ["ok", "color"],
        "additionalProperties": False,
    }
    req = request(
        CASES["short"],
        sampling={"json_schema": json.dumps(schema), "max_new_tokens": 200, "temperature": 0.0},
    )
    (complete,) = completes(await collect(stub, req))
    from transformers import AutoTokenizer

    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    tokenizer = AutoTokenizer.from_pretrained(info.tokenizer_path)
    text = tokenizer.decode(list(complete.output_ids), skip_special_tokens=True)
    value = json.loads(text)
    assert set(value) == {"ok", "color"}
    assert isinstance(value["ok"], bool)
    assert value["color"] in ("red", "green")
    assert complete.finish_reason == "stop"


async def test_32_concurrent_streams_exact_counts(stub: Any) -> None:
    async def one(i: int) -> tuple[int, int, str]:
        req = request(
            [(i * 31 + k) % VOCAB for k in range(5, 13)],
            stream=True,
            # Sampled, so EOS could come early: ignore_eos keeps the expected count exact.
            sampling={"max_new_tokens": 16 + i % 5, "temperature": 0.7, "ignore_eos": True},
        )
        responses = await collect(stub, req)
        return (
            len(stream_ids(responses)),
            completes(responses)[0].completion_tokens,
            (completes(responses)[0].finish_reason),
        )

    results = await asyncio.gather(*(one(i) for i in range(32)))
    for i, (streamed, counted, finish) in enumerate(results):
        assert streamed == counted == 16 + i % 5
        assert finish == "length"
    await wait_idle(stub)


async def test_abort_rpc_ends_stream_and_frees_scheduler(stub: Any) -> None:
    req = request(CASES["short"], stream=True, sampling={"max_new_tokens": 900, "ignore_eos": True})
    call = stub.Generate(req)
    first = await call.read()
    assert first.HasField("chunk")
    reply = await stub.Abort(pb.AbortRequest(request_id=req.request_id, reason="test"))
    assert reply.success
    rest = await read_rest(call)
    final = rest[-1].complete
    assert final.finish_reason == "abort"
    assert len(stream_ids([first, *rest])) < 900
    await wait_idle(stub)
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.active_requests == 0
    again = await stub.Abort(pb.AbortRequest(request_id=req.request_id))
    assert not again.success


async def test_client_cancel_frees_scheduler(stub: Any) -> None:
    req = request(CASES["long"], stream=True, sampling={"max_new_tokens": 900, "ignore_eos": True})
    call = stub.Generate(req)
    await call.read()
    call.cancel()
    await wait_idle(stub)
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.active_requests == 0


BAD = {
    "empty prompt": request([]),
    "id beyond vocab": request([1, VOCAB]),
    "prompt over context": request([5] * 1024),
    "negative temperature": request([1, 2], sampling={"temperature": -0.5}),
    "top_p above 1": request([1, 2], sampling={"top_p": 1.5}),
    "max_new_tokens past context": request([1, 2], sampling={"max_new_tokens": 5000}),
    "hidden states": request([1, 2], return_hidden_states=True),
    "image": request([1, 2]),
    # A rule that derives no text empties the grammar mask after "a": SGLang's CPU sampler, with
    # min_p, raised in the scheduler and ended the engine (a reliability fuzz find).
    "grammar with a dead end": request(
        [1, 2],
        sampling={"temperature": 0.5, "min_p": 0.1, "ebnf_grammar": 'root ::= "a" b\nb ::= b "x"'},
    ),
}
BAD["image"].mm_inputs.pixel_values.data = b"\x00" * 12


@pytest.mark.parametrize("case", sorted(BAD))
async def test_bad_input_is_invalid_argument(stub: Any, case: str) -> None:
    req = pb.GenerateRequest()
    req.CopyFrom(BAD[case])
    req.request_id = f"bad-{next(_counter)}"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy, health.message
    (complete,) = completes(await collect(stub, request(CASES["short"])))
    assert complete.completion_tokens == MAX_TOKENS


async def test_health_and_info(stub: Any, sglang_server: Server) -> None:
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy
    async with grpc.aio.insecure_channel(sglang_server.address) as channel:
        frame: Any = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            status = await frame.Check(health_pb2.HealthCheckRequest(service=service))
            assert status.status == health_pb2.HealthCheckResponse.SERVING
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.max_context_length == 1024  # the context, not the KV pool (65,536)
    assert info.vocab_size == VOCAB
    assert info.is_generation
    assert not info.supports_vision  # a text model: images refused (test_bad_input_is_invalid...)
    assert info.tokenizer_path
    server = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert server.server_type == "grpc"
    assert server.sglang_version == version("sglang")  # the release installed (0.5.20-0.5.23)
    assert server.max_total_num_tokens == 65536
    assert server.uptime_seconds > 0
    assert server.server_args["context_length"] == 1024


async def test_every_info_field_is_sglangs_own(
    sglang_server: Server, tiny_model: Path, walk_info: Any
) -> None:
    assert await walk_info(sglang_server, tiny_model, total_tokens=65536) == []


async def test_get_loads_sections_and_rank(stub: Any) -> None:
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    assert loads.dp_rank_count == 1
    assert loads.loads[0].max_total_num_tokens == 65536
    assert loads.loads[0].HasField("memory")
    core = await stub.GetLoads(pb.GetLoadsRequest(include=["core"], dp_rank=0))
    assert not core.loads[0].HasField("memory")
    for bad in (pb.GetLoadsRequest(include=["nope"]), pb.GetLoadsRequest(dp_rank=3)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetLoads(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_flush_cache(stub: Any) -> None:
    await wait_idle(stub)
    reply = await stub.FlushCache(common_pb2.FlushCacheRequest())
    assert reply.success, reply.message


async def test_refusals_are_unimplemented(stub: Any) -> None:
    # The LoRA RPCs are served (test_a_worker_without_lora_refuses_any_adapter_by_name_...).
    calls = [
        stub.Embed(pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=[1]))),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect_kv(stub)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "--kv-events-config" in (err.value.details() or "")


async def collect_kv(stub: Any) -> list[Any]:
    return [b async for b in stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())]


async def test_get_tokenizer_bundle(stub: Any) -> None:
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks
    assert chunks[-1].sha256


async def test_token_ids_logprob_rows(stub: Any) -> None:
    req = request(CASES["short"], return_logprob=True, token_ids_logprob=[5, 9])
    (complete,) = completes(await collect(stub, req))
    rows = complete.output_logprobs.token_ids_logprobs
    assert len(rows) == MAX_TOKENS
    assert all(list(row.token_ids) == [5, 9] for row in rows)
    assert all(all(v <= 0.0 for v in row.values) for row in rows)


async def test_profile_start_and_stop(stub: Any, tmp_path: Any) -> None:
    started = await stub.StartProfile(
        common_pb2.StartProfileRequest(output_dir=str(tmp_path), activities=["CPU"])
    )
    assert started.success, started.message
    await collect(stub, request(CASES["short"]))
    stopped = await stub.StopProfile(common_pb2.StopProfileRequest())
    assert stopped.success, stopped.message
    assert any(tmp_path.iterdir()), "the profiler wrote a trace"


async def test_the_shared_bad_requests_get_the_shared_messages(stub: Any) -> None:
    from smg_servicer_core.testing.bad_requests import assert_refused_alike

    ran = await assert_refused_alike(stub, "sglang", vocab_size=VOCAB, context_length=1024)
    assert ran == 12


async def test_metrics_count_a_known_workload_exactly(stub: Any, sglang_server: Server) -> None:
    from smg_servicer_core.testing.metrics import (
        assert_workload_counted,
        engine_gauge,
        metrics_workload,
        scrape,
    )

    assert sglang_server.metrics_port is not None
    await wait_idle(stub)
    before = await asyncio.to_thread(scrape, sglang_server.metrics_port)
    work = await metrics_workload(stub, "sglang", [5, 6, 7, 8])
    await wait_idle(stub)
    samples = await asyncio.to_thread(scrape, sglang_server.metrics_port)
    assert work.codes == {"OK": 4, "INVALID_ARGUMENT": 1}  # an aborted SGLang stream completes
    assert_workload_counted(samples, work, before)
    assert engine_gauge(samples, "running_requests") == 0  # one rank: dp_rank 0
    assert engine_gauge(samples, "kv_cache_usage_ratio") >= 0


async def test_a_schema_the_grammar_compiler_refuses_is_named_without_native_noise(
    stub: Any,
) -> None:
    # SGLang relays xgrammar's exception text, which starts with a timestamp and a C++ source path.
    schema = '{"type": "string", "minLength": 5, "maxLength": 1}'
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request([1, 2], sampling={"json_schema": schema}))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert "minLength 5 is greater than maxLength 1" in details
    assert ".cc:" not in details and "/project/" not in details


CONSTRAINT_DEAD_ENDS = {
    # After "a" the pattern allows only the end of output, which min_new_tokens forbids: no
    # token may follow. Greedy, SGLang drew token 0 (an end-of-sequence id here) and ended "stop";
    "regex, greedy, streamed": ({"regex": "a", "min_new_tokens": 8}, True),
    "json schema, greedy": ({"json_schema": '{"const": 1}', "min_new_tokens": 8}, False),
    # sampled with top-k, SGLang's CPU sampler raised on the all -inf row and the engine died.
    "regex, top-k sampled, streamed": (
        {"regex": "abc", "min_new_tokens": 8, "temperature": 0.7, "top_k": 5},
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(CONSTRAINT_DEAD_ENDS))
async def test_a_constraint_that_cannot_continue_is_failed_precondition_with_trailer(
    stub: Any, case: str
) -> None:
    sampling, stream = CONSTRAINT_DEAD_ENDS[case]
    call = stub.Generate(request(CASES["short"], stream=stream, sampling=sampling))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for response in call:
            received.append(response)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (err.value.details() or "").startswith(
        "the engine could not continue the request under its constraint: no token may follow"
    )
    trailers = [(str(k), str(v)) for k, v in (await call.trailing_metadata() or ())]
    assert ("smg-constraint-failed", "engine") in trailers
    assert not completes(received)
    # The engine goes on serving: healthy, idle, and the next request is whole.
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy, health.message
    await wait_idle(stub)
    (complete,) = completes(await collect(stub, request(CASES["short"])))
    assert complete.completion_tokens == MAX_TOKENS


async def test_a_worker_without_lora_refuses_any_adapter_by_name_and_lists_none(stub: Any) -> None:
    """Without ``--enable-lora`` a ``lora_id`` is refused naming it (SGLang would serve the base
    model silently), a load says how to turn LoRA on, and the list is the engine's: empty."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request([1, 2, 3], lora_id="my-adapter"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'my-adapter'" in (err.value.details() or "")
    assert "--enable-lora" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.LoadLoRAAdapter(pb.LoadLoRAAdapterRequest(lora_name="x", lora_path="/tmp"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--enable-lora" in (err.value.details() or "")
    listed = await stub.ListLoadedLoRAAdapters(pb.ListLoadedLoRAAdaptersRequest())
    assert list(listed.loaded_adapters) == []
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=30)).healthy

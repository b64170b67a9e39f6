"""Every ``TokenSpeedScheduler`` RPC on TokenSpeed's real front end, the GPU scheduler stood in:
status codes and fields, n > 1 child ids, aborts reaching the scheduler, secrets kept out of
``GetServerInfo``, the shared invalid-input messages, the metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.kv import KvEvents, kv_prompt
from smg_it.tokenspeed_suite import SECRET, SERVICE, Record
from smg_servicer_core.proto import common_pb2, tokenspeed_encoder_pb2
from smg_servicer_core.proto import tokenspeed_encoder_pb2_grpc as encoder_grpc
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.process import WorkerProcess
from smg_servicer_tokenspeed.info import is_secret
from smg_servicer_tokenspeed.testing.scheduler import logprob_at, token_at

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]
VOCAB = 4096
CONTEXT = 1024
EOS = {0, 2}
PROMPT = [5, 6, 7, 8]


def expected(prompt: list[int], count: int, seed: int = 0) -> list[int]:
    """The stand-in's tokens for a request (greedy requests carry TokenSpeed's pinned seed 0)."""
    return [token_at(seed, prompt, k, VOCAB, EOS) for k in range(count)]


@pytest_asyncio.fixture(loop_scope="session")
async def channel(ts_server: WorkerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(ts_server.address) as ch:
        yield ch


@pytest_asyncio.fixture(loop_scope="session")
async def stub(channel: grpc.aio.Channel) -> pb_grpc.TokenSpeedSchedulerStub:
    return pb_grpc.TokenSpeedSchedulerStub(channel)


_counter = iter(range(1_000_000))


def request(ids: list[int], rid: str | None = None, **kwargs: Any) -> pb.GenerateRequest:
    sampling = {"temperature": 0.0, "max_new_tokens": 8} | kwargs.pop("sampling", {})
    return pb.GenerateRequest(
        request_id=rid or f"t-{next(_counter)}",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),
        **kwargs,
    )


async def collect(stub: Any, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [r async for r in stub.Generate(req)]


def stream_ids(responses: list[pb.GenerateResponse], index: int = 0) -> list[int]:
    return [t for r in responses if r.HasField("chunk") and r.chunk.index == index
            for t in r.chunk.token_ids]  # fmt: skip


def completes(responses: list[pb.GenerateResponse]) -> list[pb.GenerateComplete]:
    return [r.complete for r in responses if r.HasField("complete")]


async def running(stub: Any) -> int:
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    return sum(load.num_running_reqs for load in loads.loads)


async def wait_until(check: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def idle(stub: Any) -> None:
    """The stand-in runs nothing (its own load snapshot) and no call is in flight."""

    async def check() -> bool:
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        return info.active_requests == 0 and await running(stub) == 0

    await wait_until(check)


async def long_stream(
    stub: Any, rid: str, sampling: dict[str, Any] | None = None
) -> tuple[Any, pb.GenerateResponse]:
    req = request(PROMPT, rid, stream=True, sampling={"max_new_tokens": 900} | (sampling or {}))
    call = stub.Generate(req)
    first = await call.read()
    assert first.HasField("chunk")
    return call, first


async def read_rest(call: Any) -> list[pb.GenerateResponse]:
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    return rest


# -- Generate --------------------------------------------------------------------------------


@pytest.mark.standin
async def test_greedy_stream_and_non_stream_give_the_schedulers_tokens(stub: Any) -> None:
    want = expected(PROMPT, 8)
    (plain,) = completes(await collect(stub, request(PROMPT)))
    assert list(plain.output_ids) == want
    assert plain.finish_reason == "length"
    assert (plain.prompt_tokens, plain.completion_tokens) == (len(PROMPT), 8)
    responses = await collect(stub, request(PROMPT, stream=True))
    assert stream_ids(responses) == want
    assert all(len(r.chunk.token_ids) >= 1 for r in responses if r.HasField("chunk"))
    (final,) = completes(responses)
    assert responses[-1].HasField("complete") and not final.output_ids
    assert final.completion_tokens == 8
    assert final.weight_version == "default"


@pytest.mark.standin
async def test_sampled_requests_carry_their_seed(stub: Any, record: Record) -> None:
    req = request(PROMPT, sampling={"temperature": 0.8, "sampling_seed": 41, "top_k": 5})
    (complete,) = completes(await collect(stub, req))
    assert list(complete.output_ids) == expected(PROMPT, 8, seed=41)
    (sent,) = [r for r in record.entries("generate") if r["rid"] == req.request_id]
    assert sent["seed"] == 41


@pytest.mark.standin
@pytest.mark.parametrize("stream", [False, True])
async def test_n3_gives_three_choices_with_child_ids(
    stub: Any, record: Record, stream: bool
) -> None:
    sampling = {"n": 3, "temperature": 1.0, "sampling_seed": 7, "max_new_tokens": 5}
    req = request(PROMPT, stream=stream, sampling=sampling)
    responses = await collect(stub, req)
    finals = completes(responses)
    assert sorted(c.index for c in finals) == [0, 1, 2]
    assert all(c.completion_tokens == 5 for c in finals)
    children = [r for r in record.entries("generate") if r["rid"].startswith(req.request_id)]
    assert sorted(r["rid"] for r in children) == [f"{req.request_id}-n{i}" for i in range(3)]
    assert sorted(r["seed"] for r in children) == [7, 8, 9]
    for choice in range(3):
        got = (
            stream_ids(responses, choice)
            if stream
            else list(finals[[c.index for c in finals].index(choice)].output_ids)
        )
        assert got == expected(PROMPT, 5, seed=7 + choice)


@pytest.mark.standin
@pytest.mark.parametrize("no_stop_trim", [False, True])
async def test_stop_token_is_trimmed_unless_asked(stub: Any, no_stop_trim: bool) -> None:
    want = expected(PROMPT, 8)
    stop = want[3]
    sampling = {"stop_token_ids": [stop], "no_stop_trim": no_stop_trim}
    (complete,) = completes(await collect(stub, request(PROMPT, sampling=sampling)))
    assert complete.finish_reason == "stop"
    assert complete.matched_token_id == stop
    cut = want.index(stop)
    assert list(complete.output_ids) == want[: cut + 1 if no_stop_trim else cut]
    assert complete.completion_tokens == cut + 1
    streamed = await collect(stub, request(PROMPT, stream=True, sampling=sampling))
    assert stream_ids(streamed) == list(complete.output_ids)


@pytest.mark.standin
@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_line_up_with_the_tokens(stub: Any, stream: bool) -> None:
    responses = await collect(stub, request(PROMPT, stream=stream, return_logprob=True))
    if stream:
        parts = [r.chunk.output_logprobs for r in responses if r.HasField("chunk")]
    else:
        parts = [completes(responses)[0].output_logprobs]
    ids = [t for p in parts for t in p.token_ids]
    values = [v for p in parts for v in p.token_logprobs]
    want = expected(PROMPT, 8)
    assert ids == want
    assert values == pytest.approx([logprob_at(k, t) for k, t in enumerate(want)], abs=1e-6)


async def test_top_logprobs_are_refused_with_tokenspeeds_message(stub: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request(PROMPT, return_logprob=True, top_logprobs_num=2))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_logprobs_num" in (err.value.details() or "")


@pytest.mark.standin
async def test_constraints_reach_the_scheduler(stub: Any, record: Record) -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    regex = request(PROMPT, sampling={"regex": "[ab]+"})
    wrapped = request(PROMPT, sampling={"json_schema": schema})
    await collect(stub, regex)
    await collect(stub, wrapped)
    sent = {r["rid"]: r for r in record.entries("generate")}
    assert sent[regex.request_id]["regex"] == "[ab]+"
    # --reasoning-parser qwen3: TokenSpeed defers the schema past the reasoning channel.
    assert sent[wrapped.request_id]["json_schema"] is None
    tag = json.loads(sent[wrapped.request_id]["structural_tag"])
    assert tag["type"] == "structural_tag"
    assert "</think>" in json.dumps(tag)


@pytest.mark.standin
async def test_bootstrap_and_rank_are_forwarded(stub: Any, record: Record) -> None:
    info = pb.KvBootstrapInfo(bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=42)
    req = request(PROMPT, kv_bootstrap_info=info, data_parallel_rank=0)
    await collect(stub, req)
    (sent,) = [r for r in record.entries("generate") if r["rid"] == req.request_id]
    assert sent["bootstrap_room"] == 42
    # One attention-DP rank: TokenSpeed drops a pin that has nothing to choose from.
    assert sent["data_parallel_rank"] is None


@pytest.mark.standin
async def test_32_concurrent_streams_exact_counts(stub: Any) -> None:
    async def one(i: int) -> tuple[list[int], int]:
        prompt = [(i * 31 + k) % VOCAB for k in range(5, 13)]
        req = request(prompt, stream=True, sampling={"max_new_tokens": 16 + i % 5})
        responses = await collect(stub, req)
        return stream_ids(responses), completes(responses)[0].completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(32)))
    for i, (ids, counted) in enumerate(results):
        prompt = [(i * 31 + k) % VOCAB for k in range(5, 13)]
        assert ids == expected(prompt, 16 + i % 5)
        assert counted == 16 + i % 5
    await idle(stub)


@pytest.mark.standin
@pytest.mark.parametrize(
    ("rid", "code"),
    [
        ("refuse-400", grpc.StatusCode.INVALID_ARGUMENT),
        ("refuse-503", grpc.StatusCode.UNAVAILABLE),
        ("refuse-500", grpc.StatusCode.INTERNAL),
    ],
)
async def test_scheduler_refusals_map_through_the_http_table(
    stub: Any, rid: str, code: grpc.StatusCode
) -> None:
    for stream in (False, True):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub, request(PROMPT, f"{rid}-{next(_counter)}", stream=stream))
        assert err.value.code() == code
        assert "refused" in (err.value.details() or "")
    (complete,) = completes(await collect(stub, request(PROMPT)))
    assert complete.completion_tokens == 8


async def test_the_shared_bad_requests_get_the_shared_messages(stub: Any) -> None:
    from smg_servicer_core.testing.bad_requests import assert_refused_alike

    ran = await assert_refused_alike(stub, "tokenspeed", vocab_size=VOCAB, context_length=CONTEXT)
    assert ran == 12
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy, health.message


async def test_text_input_and_a_duplicate_id_are_refused(stub: Any) -> None:
    untokenized = pb.GenerateRequest(request_id="text", sampling_params=pb.SamplingParams())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, untokenized)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    call, _ = await long_stream(stub, "dup")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request(PROMPT, "dup"))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    call.cancel()
    await idle(stub)


def _image_request() -> pb.GenerateRequest:
    pixels = pb.TensorData(shape=[1, 4], dtype="float32", inline=bytes(16))
    image = pb.MultimodalItem(
        modality=common_pb2.IMAGE,
        content_hash=bytes(range(32)),
        encoder_input=pixels,
        placeholders=[pb.PlaceholderRange(offset=1, length=2)],
        placeholder_token_id=9,
    )
    return request([1, 9, 9, 2], mm_inputs=pb.MultimodalInputs(items=[image]))


async def test_images_on_a_text_model_get_tokenspeeds_refusal(stub: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, _image_request())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text-only model" in (err.value.details() or "")


async def test_multimodal_items_become_tokenspeeds_objects_on_its_wire() -> None:
    """What the servicer builds from an image item is what TokenSpeed's scheduler wire carries:
    its own ``MultimodalInputs``, pad values set, encodable by its ``MsgpackEncoder``."""
    import torch

    from smg_servicer_tokenspeed import _tokenspeed as ts
    from smg_servicer_tokenspeed import mm

    items = mm.items(_image_request())
    assert items is not None
    built = ts.multimodal_inputs(items, "bfloat16")
    (item,) = built.mm_items
    assert item.feature.dtype == torch.bfloat16 and tuple(item.feature.shape) == (1, 4)
    assert item.offsets == [(1, 2)] and item.pad_value is not None
    assert item.hash == int.from_bytes(bytes(range(8)), "little")
    assert built.im_token_id == 9
    assert ts.io.MsgpackEncoder().encode(built)


# -- Abort and cancel ------------------------------------------------------------------------


@pytest.mark.standin
async def test_abort_rpc_ends_every_choice_and_reaches_the_scheduler(
    stub: Any, record: Record
) -> None:
    call, first = await long_stream(stub, "abort-me", sampling={"n": 2, "temperature": 0.5})
    del first
    reply = await stub.Abort(pb.AbortRequest(request_id="abort-me", reason="test"))
    assert reply.success and reply.message == "aborted"
    rest = await read_rest(call)
    finals = completes(rest)
    assert sorted(c.index for c in finals) == [0, 1]
    assert all(c.finish_reason == "abort" for c in finals)
    await idle(stub)
    assert {"abort-me-n0", "abort-me-n1"} <= set(record.rids("abort"))
    again = await stub.Abort(pb.AbortRequest(request_id="abort-me"))
    assert (again.success, again.message) == (False, "not found")


@pytest.mark.standin
async def test_client_cancel_aborts_every_child_in_the_scheduler(stub: Any, record: Record) -> None:
    call, _ = await long_stream(stub, "cancel-me")
    call.cancel()
    await idle(stub)
    assert "cancel-me" in record.rids("abort")
    call, _ = await long_stream(stub, "cancel-n", sampling={"n": 2, "temperature": 0.5})
    call.cancel()
    await idle(stub)
    assert {"cancel-n-n0", "cancel-n-n1"} <= set(record.rids("abort"))


# -- health and info -------------------------------------------------------------------------


@pytest.mark.standin
async def test_health_is_deep_and_agrees_with_grpc_health(
    stub: Any, channel: grpc.aio.Channel, record: Record
) -> None:
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert (health.healthy, health.message) == (True, "OK")
    probes = [r for r in record.rids("generate") if r.startswith("HEALTH_CHECK_")]
    assert probes, "the deep probe went through the scheduler"
    frame: Any = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        status = await frame.Check(health_pb2.HealthCheckRequest(service=service))
        assert status.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.standin
async def test_model_info(stub: Any, ts_server: WorkerProcess) -> None:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.vocab_size == VOCAB
    assert info.max_context_length == CONTEXT
    assert info.max_req_input_len == CONTEXT - 1
    assert info.model_type == "llama"
    assert list(info.architectures) == ["LlamaForCausalLM"]
    assert sorted(info.eos_token_ids) == sorted(EOS)
    assert info.pad_token_id == 3
    assert info.tokenizer_path and info.model_path
    assert info.weight_version == "default"
    assert not info.supports_vision and not info.supports_multimodal


def _keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [k for k, v in value.items() for k in (k, *_keys(v))]
    if isinstance(value, list):
        return [k for item in value for k in _keys(item)]
    return []


@pytest.mark.standin
async def test_server_info_is_json_safe_and_holds_no_secret(stub: Any) -> None:
    from google.protobuf import json_format

    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    args = json_format.MessageToDict(info.server_args)
    text = json.dumps(args)
    assert SECRET not in text
    assert not [k for k in _keys(args) if is_secret(k)], "a secret-like key was shown"
    assert args["reasoning_parser"] == "qwen3"
    assert args["engine_reasoning_parser"] == "qwen3"
    assert args["constrained_decoding_start"] == "first_token"
    assert args["enable_inline_detokenizer"] is False
    assert info.tokenspeed_version == "0.1.1"
    assert info.max_total_num_tokens == 65536
    assert info.uptime_seconds > 0
    assert info.start_time.seconds > 0
    assert not info.is_paused
    assert json_format.MessageToDict(info.scheduler_info)["max_model_len"] == CONTEXT


@pytest.mark.standin
async def test_is_paused_follows_tokenspeeds_own_pause_and_resume(
    control_port: int, stub: Any, record: Record
) -> None:
    """TokenSpeed's own RL control app (``--rl-control-port``, in the worker's process) pauses
    its scheduler: ``is_paused`` is the scheduler's answer, True until the app resumes it; a
    request sent meanwhile waits (TokenSpeed holds admission) and is served after the resume."""
    import httpx

    await idle(stub)
    control = f"http://127.0.0.1:{control_port}"
    auth = {"Authorization": f"Bearer {SECRET}"}
    async with httpx.AsyncClient(base_url=control, headers=auth, timeout=30) as http:
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert not info.is_paused
        paused = await http.post("/pause_generation", json={"mode": "keep"})
        assert paused.status_code == 200, paused.text
        waiting: asyncio.Task[list[pb.GenerateResponse]] | None = None
        try:
            assert (await stub.GetServerInfo(pb.GetServerInfoRequest())).is_paused
            waiting = asyncio.ensure_future(
                collect(stub, request(PROMPT, sampling={"max_new_tokens": 3}))
            )
            done, _ = await asyncio.wait({waiting}, timeout=0.5)
            assert not done, "a request was served while the scheduler was paused"
        finally:
            resumed = await http.post("/continue_generation")
        assert resumed.status_code == 200, resumed.text
        assert not (await stub.GetServerInfo(pb.GetServerInfoRequest())).is_paused
        assert waiting is not None
        served = await asyncio.wait_for(waiting, 30)
    assert list(served[-1].complete.output_ids) == expected(PROMPT, 3)
    assert {"type": "pause", "mode": "keep", "running": 0} in record.entries()


@pytest.mark.standin
async def test_every_info_field_is_tokenspeeds_own(
    ts_server: WorkerProcess, tiny_model: Path, walk_info: Any
) -> None:
    assert await asyncio.to_thread(walk_info, ts_server, tiny_model, running=True) == []


@pytest.mark.standin
async def test_loads_follow_the_scheduler(stub: Any) -> None:
    await idle(stub)
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    assert loads.version == "0.1.1"
    assert loads.dp_rank_count == 1
    (row,) = loads.loads
    assert (row.max_total_num_tokens, row.max_running_requests) == (65536, 8)
    call, _ = await long_stream(stub, "busy")

    async def busy() -> bool:
        return await running(stub) == 1

    await wait_until(busy)
    loaded = await stub.GetLoads(pb.GetLoadsRequest(dp_rank=0))
    assert loaded.loads[0].num_used_tokens > 0
    assert loaded.aggregate.total_running_reqs == 1
    call.cancel()
    await idle(stub)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetLoads(pb.GetLoadsRequest(dp_rank=3))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.standin
async def test_flush_cache_waits_for_idle_and_refuses_when_busy(stub: Any) -> None:
    await idle(stub)
    ok = await stub.FlushCache(common_pb2.FlushCacheRequest())
    assert (ok.success, ok.message) == (True, "cache flushed")
    call, _ = await long_stream(stub, "flush-busy", sampling={"max_new_tokens": 2000})
    busy = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=0.5))
    assert not busy.success
    assert busy.message.startswith("Cache flush refused: requests still in flight after")
    call.cancel()
    await idle(stub)
    for bad in (-1.0, float("nan")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.standin
async def test_profile_start_and_stop(stub: Any, record: Record, tmp_path: Any) -> None:
    start = common_pb2.StartProfileRequest(output_dir=str(tmp_path), activities=["CPU"])
    started = await stub.StartProfile(start)
    assert (started.success, started.message) == (True, "profiling started")
    again = await stub.StartProfile(start)
    assert (again.success, again.message) == (False, "profiling is already running")
    stopped = await stub.StopProfile(common_pb2.StopProfileRequest())
    assert stopped.success
    late = await stub.StopProfile(common_pb2.StopProfileRequest())
    assert (late.success, late.message) == (False, "profiling is not running")
    assert str(tmp_path) in [r["output_dir"] for r in record.entries("profile")]


async def test_get_tokenizer_bundle(stub: Any) -> None:
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks and chunks[-1].sha256


async def test_encoder_is_unimplemented_with_a_reason(channel: grpc.aio.Channel) -> None:
    encoder: Any = encoder_grpc.TokenSpeedEncoderStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await encoder.Encode(tokenspeed_encoder_pb2.EncodeRequest(request_id="e"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "encode role" in (err.value.details() or "")


@pytest.mark.standin
async def test_kv_events_flow_from_tokenspeeds_publisher(stub: Any) -> None:
    """TokenSpeed's own ZMQ publisher (in the stand-in) -> the KV bridge -> SubscribeKvEvents:
    stored chains holding the prompts' blocks, in sequence, the engine load on every batch; a
    flush removes them."""
    sent: list[list[int]] = []
    async with KvEvents(stub) as events:
        for attempt in range(40):  # the SUB needs a moment to join: keep sending new prompts
            ids = kv_prompt(attempt, 40)
            sent.append(ids)
            await collect(stub, request(ids, sampling={"max_new_tokens": 2}))
            await asyncio.sleep(0.05)
            if "stored" in events.kinds() and attempt >= 3:
                break
        await idle(stub)
        flushed = await stub.FlushCache(common_pb2.FlushCacheRequest())
        assert flushed.success

        async def removed() -> bool:
            return "removed" in events.kinds()

        await wait_until(removed)
    seqs = events.sequence_numbers()
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no duplicate, no hole"
    stored = events.stored()
    roots = [s for s in stored if not s.HasField("parent_block_hash")]
    assert any(list(s.blocks[0].token_ids) == ids[:16] for s in roots for ids in sent), (
        "a root block holds the start of a prompt we sent"
    )
    assert all(len(b.token_ids) == 16 for s in stored for b in s.blocks)
    assert all(b.HasField("load") for b in events.batches), "every batch carries the engine load"


async def test_metrics_count_a_known_workload_exactly(stub: Any, ts_server: WorkerProcess) -> None:
    from smg_servicer_core.testing.metrics import (
        assert_workload_counted,
        engine_gauge,
        metrics_workload,
        scrape,
    )

    assert ts_server.metrics_port is not None
    await idle(stub)
    before = await asyncio.to_thread(scrape, ts_server.metrics_port)
    work = await metrics_workload(stub, "tokenspeed", PROMPT)
    await idle(stub)
    samples = await asyncio.to_thread(scrape, ts_server.metrics_port)
    assert work.codes == {"OK": 4, "INVALID_ARGUMENT": 1}
    assert_workload_counted(samples, work, before)
    assert engine_gauge(samples, "running_requests") == 0  # one rank: dp_rank 0

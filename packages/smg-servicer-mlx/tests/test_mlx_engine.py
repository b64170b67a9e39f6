"""The MLX servicer on the real mlx-lm engine with a float32 tiny model."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from smg_servicer_core.proto import mlx_engine_pb2 as pb
from smg_servicer_core.testing import mlx_generate

pytestmark = pytest.mark.engine

PROMPT = [1, 882, 198, 2546, 686, 1599, 2, 198, 1, 520, 198]


def reference(model_dir, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """mlx-lm's own greedy loop (generate_step), no servicer involved."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    loaded: Any = load(str(model_dir))
    model = loaded[0]
    tokens, logprobs = [], []
    lp: Any
    for token, lp in generate_step(
        mx.array(prompt), model, max_tokens=n, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        tokens.append(int(token))
        logprobs.append(float(lp[int(token)].item()))
    return tokens, logprobs


async def read_all(call) -> list[pb.GenerateResponse]:
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


async def test_greedy_matches_mlx_lm_token_for_token(mlx_stack, tiny_model) -> None:
    _, _, stub = mlx_stack
    want, want_lp = reference(tiny_model, PROMPT, 24)
    [response] = await read_all(
        stub.Generate(
            mlx_generate(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=3)
        )
    )
    complete = response.complete
    assert list(complete.output_ids) == want
    assert complete.finish_reason == "length"
    assert (complete.prompt_tokens, complete.completion_tokens) == (len(PROMPT), 24)
    assert list(complete.output_logprobs.token_logprobs) == pytest.approx(want_lp, abs=1e-4)
    for top, chosen in zip(complete.output_logprobs.top_logprobs, want, strict=True):
        assert len(top.values) == 3
        assert top.token_ids[0] == chosen, "greedy picks the most likely token"
        assert list(top.values) == sorted(top.values, reverse=True)

    streamed = await read_all(
        stub.Generate(
            mlx_generate(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True, stream=True)
        )
    )
    assert [t for r in streamed[:-1] for t in r.chunk.token_ids] == want
    counts = [r.chunk.completion_tokens for r in streamed[:-1]]
    assert counts == sorted(set(counts))
    assert counts[-1] == 24, "cumulative completion_tokens"
    assert streamed[-1].complete.completion_tokens == 24


async def test_stop_token_is_reported(mlx_stack, tiny_model) -> None:
    _, _, stub = mlx_stack
    want, _ = reference(tiny_model, PROMPT, 8)
    stop = want[4]
    first = want.index(stop)
    [response] = await read_all(
        stub.Generate(
            mlx_generate(
                PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[stop]
            )
        )
    )
    assert list(response.complete.output_ids) == want[: first + 1]
    assert response.complete.finish_reason == "stop"
    assert response.complete.matched_stop_token_id == stop


async def test_seed_is_per_request(mlx_stack) -> None:
    _, _, stub = mlx_stack

    async def sample(seed: int) -> list[int]:
        [r] = await read_all(
            stub.Generate(
                mlx_generate(PROMPT, max_tokens=12, temperature=1.0, ignore_eos=True, seed=seed)
            )
        )
        return list(r.complete.output_ids)

    a, b = await asyncio.gather(sample(7), sample(7))
    assert a == b
    assert await sample(7) == a
    assert await sample(8) != a


async def test_thirty_two_concurrent_streams(mlx_stack) -> None:
    _, servicer, stub = mlx_stack

    async def one(i: int) -> tuple[int, int]:
        responses = await read_all(
            stub.Generate(
                mlx_generate(
                    [1, 10 + i, 20 + i], max_tokens=16 + i % 5, stream=True, ignore_eos=True
                )
            )
        )
        return sum(len(r.chunk.token_ids) for r in responses[:-1]), responses[
            -1
        ].complete.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(32)))
    assert results == [(16 + i % 5, 16 + i % 5) for i in range(32)]
    assert len(servicer.registry) == 0


async def test_abort_mid_stream_stops_generation(mlx_stack) -> None:
    engine, _, stub = mlx_stack
    call = stub.Generate(
        mlx_generate(PROMPT, max_tokens=1500, stream=True, ignore_eos=True, request_id="abort-me")
    )
    for _ in range(3):
        await call.read()
    assert (await stub.GetServerInfo(pb.GetServerInfoRequest())).active_requests == 1
    await stub.Abort(pb.AbortRequest(request_ids=["abort-me"]))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await read_all(call)
    assert ended.value.code() == grpc.StatusCode.ABORTED
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.active_requests == 0
    assert "abort-me" not in engine._by_id
    assert info.server_type == "mlx-grpc"


@pytest.mark.parametrize(
    "request_",
    [
        mlx_generate([]),
        mlx_generate([4096]),
        mlx_generate([5] * 2048),
        mlx_generate([5], temperature=-0.5),
        mlx_generate([5], top_p=1.5),
        mlx_generate([5], top_p=-0.1),
        mlx_generate([5], max_tokens=0),
    ],
    ids=[
        "empty",
        "id-ge-vocab",
        "over-context",
        "neg-temperature",
        "top-p-high",
        "top-p-negative",
        "max-tokens-zero",
    ],
)
async def test_bad_inputs_are_invalid_argument(mlx_stack, request_) -> None:
    _, _, stub = mlx_stack
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await read_all(stub.Generate(request_))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy


async def test_text_input_and_model_info(mlx_stack) -> None:
    _, _, stub = mlx_stack
    [r] = await read_all(
        stub.Generate(
            pb.GenerateRequest(
                request_id="txt",
                text="Hello, world!",
                sampling_params=pb.SamplingParams(max_tokens=4, ignore_eos=True),
            )
        )
    )
    assert r.complete.completion_tokens == 4 and r.complete.prompt_tokens > 0
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (info.vocab_size, info.max_context_length, list(info.eos_token_ids)) == (
        4096,
        2048,
        [2, 0],
    )


async def test_engine_warms_every_sampler_kind_before_serving(mlx_stack, tiny_model) -> None:
    """The warm-up ran one short generation per sampler kind before ready, and left nothing in
    the batch: the first real request is already token-exact (the parity test above)."""
    engine, _, _ = mlx_stack
    assert engine.warmed == ("greedy", "sampled", "seeded")
    assert engine.warmup_s > 0
    assert engine.load() == (0, 0)

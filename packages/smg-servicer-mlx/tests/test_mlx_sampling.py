"""Sampling fields reach the engine and change what it does; admission is bounded."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile

import grpc
import pytest

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import mlx_engine_pb2 as pb
from smg_servicer_core.testing import mlx_generate

pytestmark = pytest.mark.engine

PROMPT = [1, 882, 198, 2546, 686, 1599, 2, 198, 1, 520, 198]


async def complete(stub, **kwargs) -> pb.GenerateComplete:
    call = stub.Generate(mlx_generate(PROMPT, ignore_eos=True, **kwargs))
    responses = []
    while (message := await call.read()) is not grpc.aio.EOF:
        responses.append(message)
    return responses[-1].complete


async def test_logit_bias_forces_a_token(mlx_stack) -> None:
    _, _, stub = mlx_stack
    result = await complete(stub, max_tokens=6, temperature=0.0, logit_bias={777: 100.0})
    assert list(result.output_ids) == [777] * 6


async def test_repetition_penalty_changes_greedy_output(mlx_stack) -> None:
    _, _, stub = mlx_stack
    plain = await complete(stub, max_tokens=40, temperature=0.0)
    assert len(set(plain.output_ids)) < 40, "the random model repeats itself greedily"
    penalised = await complete(
        stub,
        max_tokens=40,
        temperature=0.0,
        repetition_penalty=5.0,
        frequency_penalty=1.5,
        presence_penalty=1.5,
    )
    assert list(penalised.output_ids) != list(plain.output_ids)
    assert len(set(penalised.output_ids)) > len(set(plain.output_ids))


async def test_top_k_one_is_greedy_and_min_p_runs(mlx_stack) -> None:
    _, _, stub = mlx_stack
    greedy = await complete(stub, max_tokens=12, temperature=0.0)
    top1 = await complete(stub, max_tokens=12, temperature=1.5, top_k=1, seed=3)
    assert list(top1.output_ids) == list(greedy.output_ids)
    sampled = await complete(stub, max_tokens=12, temperature=1.0, top_p=0.9, min_p=0.05, seed=3)
    assert sampled.completion_tokens == 12


async def test_a_top_k_past_the_vocabulary_keeps_every_token(mlx_stack) -> None:
    # mlx-lm's top-k filter raises on k >= vocab inside the batch step, which ended the engine
    # thread (and the worker) for every request in flight: the reliability fuzz sent 2**31.
    _, _, stub = mlx_stack
    unfiltered = await complete(stub, max_tokens=12, temperature=1.0, seed=5)
    for k in (4096, 2**31):  # the tiny model's vocabulary is 4096
        wide = await complete(stub, max_tokens=12, temperature=1.0, top_k=k, seed=5)
        assert list(wide.output_ids) == list(unfiltered.output_ids)
    assert (await complete(stub, max_tokens=4, temperature=0.0)).completion_tokens == 4


async def test_a_negative_seed_is_a_seed(mlx_stack) -> None:
    # The wire's seed is an int32; MLX's PRNG key refused a negative one inside the engine thread.
    _, _, stub = mlx_stack
    runs = [await complete(stub, max_tokens=12, temperature=1.0, seed=s) for s in (-7, -7, 7)]
    assert list(runs[0].output_ids) == list(runs[1].output_ids)
    assert list(runs[0].output_ids) != list(runs[2].output_ids)


async def test_max_tokens_defaults_to_the_context_left(mlx_stack, tiny_model) -> None:
    _, _, stub = mlx_stack
    long_prompt = [5] * 2040
    call = stub.Generate(mlx_generate(long_prompt, max_tokens=None, ignore_eos=True))
    [response] = [m async for m in call]
    assert response.complete.completion_tokens == 2048 - 2040
    assert response.complete.finish_reason == "length"


async def test_tokenizer_bundle_of_the_model(mlx_stack, tiny_model) -> None:
    _, _, stub = mlx_stack
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "tokenizer.json" in names and "model.safetensors" not in names


class TestAdmissionBound:
    @pytest.fixture
    def engine_options(self) -> dict[str, int]:
        # One running sequence and no waiting room: a second request must be refused.
        return {"completion_batch_size": 1, "prefill_batch_size": 1, "max_queue": 0}

    async def test_full_engine_is_resource_exhausted(self, mlx_stack) -> None:
        engine, _, stub = mlx_stack
        long_call = stub.Generate(
            mlx_generate(PROMPT, max_tokens=2000, stream=True, ignore_eos=True, request_id="big")
        )
        await long_call.read()  # running now; 2,000 tokens take well over a second
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await complete(stub, max_tokens=2)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "big" in engine._by_id
        long_call.cancel()


async def test_a_request_whose_sampling_cannot_be_set_up_fails_alone(
    mlx_stack, monkeypatch
) -> None:
    # A fault injected where the engine thread builds a request's sampler: that request gets
    # INTERNAL (no exception text), the one beside it and the engine go on.
    from smg_servicer_mlx import _engine

    real = _engine._sampler

    def picky(params):
        if params.temperature == 0.75:
            raise RuntimeError("injected: secret detail")
        return real(params)

    monkeypatch.setattr(_engine, "_sampler", picky)
    _, _, stub = mlx_stack
    beside = asyncio.create_task(complete(stub, max_tokens=12, temperature=0.0))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await complete(stub, max_tokens=12, temperature=0.75)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "could not set up" in (info.value.details() or "")
    assert "secret" not in (info.value.details() or "")
    assert (await beside).completion_tokens == 12
    assert (await complete(stub, max_tokens=4, temperature=0.0)).completion_tokens == 4

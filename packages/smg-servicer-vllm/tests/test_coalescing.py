"""Adaptive coalescing on vLLM (core ``stream``): the steps a stream is behind on go out as one
chunk; ``SMG_STREAM_COALESCE=0`` sends them one token per chunk; the ids are the same either way.

The lagging reader is the servicer's own ``Generate`` generator resumed late, as gRPC resumes it
once it has taken the previous message. The fake and the real engine are both checked, so the
benchmark's fake merges where vLLM does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_vllm.testing import FakeAsyncLLM

pytestmark = [pytest.mark.contract, pytest.mark.asyncio(loop_scope="session")]

MAX_TOKENS = 12
#: Long enough for the tiny model (a few ms a step) to make every token while the reader waits.
LAG_S = 1.0


class _Context:
    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: Any, details: str = "") -> None:
        raise AssertionError(f"unexpected abort {code}: {details}")


@pytest.fixture(params=["fake", "vllm"])
def llm(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeAsyncLLM()
    return request.getfixturevalue("async_llm")


async def _read(stream: AsyncIterator[Any], lag_after_first: bool) -> list[Any]:
    out = [await anext(stream)]
    if lag_after_first:
        await asyncio.sleep(LAG_S)  # the reader falls behind (gRPC still holds its message)
    out.extend([item async for item in stream])
    return out


def _request(logprobs: int | None = None) -> pb.GenerateRequest:
    extra: dict[str, Any] = {} if logprobs is None else {"logprobs": logprobs}
    return generate_request(
        "vllm", [5, 6, 7, 8], max_tokens=MAX_TOKENS, stream=True, temperature=0.0,
        ignore_eos=True, **extra,
    )  # fmt: skip


async def _generate(llm: Any, coalesce: bool, lag: bool, **kw: Any) -> list[pb.GenerateResponse]:
    from smg_servicer_vllm.servicer import VllmEngineServicer

    servicer = VllmEngineServicer(llm, 0.0)
    servicer.coalesce = coalesce
    return await _read(servicer.Generate(_request(**kw), _Context()), lag)  # type: ignore[arg-type]


def _chunks(responses: list[pb.GenerateResponse]) -> list[pb.GenerateStreamChunk]:
    return [r.chunk for r in responses if r.HasField("chunk")]


def _ids(responses: list[pb.GenerateResponse]) -> list[int]:
    return [t for c in _chunks(responses) for t in c.token_ids]


async def test_the_engine_merges_what_a_lagging_reader_missed(llm: Any) -> None:
    """vLLM's collector (and the fake's) hands a late reader every step it missed in one output."""
    from smg_servicer_vllm import _engine
    from smg_servicer_vllm.sampling import to_sampling_spec

    spec = to_sampling_spec(_request().sampling_params)
    params = _engine.sampling_params(spec, stream=True, kv_transfer=None)
    outputs = await _read(llm.generate(_engine.tokens_prompt([5, 6, 7, 8]), params, "lag-1"), True)
    sizes = [len(o.outputs[0].token_ids) for o in outputs]
    assert sum(sizes) == MAX_TOKENS
    assert max(sizes) > 1, sizes
    assert outputs[-1].finished


async def test_a_lagging_stream_gets_one_chunk_and_the_same_ids(llm: Any) -> None:
    keeping_up = await _generate(llm, coalesce=True, lag=False)
    lagging = await _generate(llm, coalesce=True, lag=True)
    assert _ids(lagging) == _ids(keeping_up)
    chunks = _chunks(lagging)
    assert len(chunks) < MAX_TOKENS
    assert any(len(c.token_ids) > 1 for c in chunks)
    # vLLM's wire: completion_tokens is the chunk's own count; the complete carries the total.
    assert all(c.completion_tokens == len(c.token_ids) for c in chunks)
    complete = lagging[-1].complete
    assert complete.completion_tokens == MAX_TOKENS
    assert complete.finish_reason == "length"


async def test_without_coalescing_every_token_is_its_own_chunk(llm: Any) -> None:
    coalesced = await _generate(llm, coalesce=True, lag=True, logprobs=2)
    split = await _generate(llm, coalesce=False, lag=True, logprobs=2)
    chunks = _chunks(split)
    assert [len(c.token_ids) for c in chunks] == [1] * MAX_TOKENS
    assert _ids(split) == _ids(coalesced)
    # Logprobs follow their token, position by position.
    assert [lp for c in chunks for lp in c.output_logprobs.token_logprobs] == [
        lp for c in _chunks(coalesced) for lp in c.output_logprobs.token_logprobs
    ]
    if not isinstance(llm, FakeAsyncLLM):  # the fake computes no logprobs
        assert [c.output_logprobs.token_ids[0] for c in chunks] == _ids(split)
    complete = split[-1].complete
    assert complete.completion_tokens == MAX_TOKENS
    assert list(complete.output_ids) == list(chunks[-1].token_ids)

"""Embed on the real vLLM pooling runner: the servicer returns the engine's own vector."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from smg_servicer_core.proto import vllm_engine_pb2 as pb

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

IDS = [1, 882, 198, 2546, 686, 1599]


async def test_embed_returns_the_engines_vector(embed_stack, embed_llm) -> None:
    from vllm import PoolingParams, TokensPrompt

    _, stub = embed_stack
    want: Any = None
    async for output in embed_llm.encode(
        TokensPrompt(prompt_token_ids=IDS), PoolingParams(task="embed"), "direct-embed"
    ):
        want = output
    expected = [float(v) for v in want.outputs.data.tolist()]
    response = await stub.Embed(
        pb.EmbedRequest(request_id="e-1", tokenized=pb.TokenizedInput(input_ids=IDS))
    )
    assert response.embedding_dim == len(expected) == 128
    assert list(response.embedding) == pytest.approx(expected, abs=1e-5)
    assert response.prompt_tokens == len(IDS)
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.is_generation is False


async def test_embed_without_tokens_is_invalid(embed_stack) -> None:
    _, stub = embed_stack
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Embed(pb.EmbedRequest(request_id="e-2"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

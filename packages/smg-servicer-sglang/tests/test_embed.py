"""Embed on the real scheduler: SGLang serving the tiny Llama as an embedding model
(``--is-embedding``, last-token pooling); the vectors equal ``sglang.Engine``'s."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from smg_it.sglang_reference import EMBED_CASES
from smg_it.sglang_suite import Server, run_reference, start_server
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def embed_reference(tiny_model: Path) -> dict[str, list[float]]:
    return run_reference(tiny_model, "--embed")


@pytest.fixture(scope="module")
def embed_server(tiny_model: Path) -> Iterator[Server]:
    server = start_server(tiny_model, "--is-embedding")
    try:
        server.wait_serving()  # the warm-up is an Embed for an embedding model
        yield server
    finally:
        assert server.stop() == 0, server.tail()


@pytest_asyncio.fixture(loop_scope="session")
async def stub(embed_server: Server) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(embed_server.address) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


async def test_every_info_field_is_sglangs_own(
    embed_server: Server, tiny_model: Path, walk_info: Any
) -> None:
    assert await walk_info(embed_server, tiny_model, total_tokens=65536, embedding=True) == []


@pytest.mark.parametrize("name", sorted(EMBED_CASES))
async def test_embedding_equals_engine(stub: Any, embed_reference: Any, name: str) -> None:
    ids = EMBED_CASES[name]
    reply = await stub.Embed(
        pb.EmbedRequest(request_id=f"e-{name}", tokenized=pb.TokenizedInput(input_ids=ids))
    )
    assert reply.prompt_tokens == len(ids)
    assert reply.embedding_dim == len(reply.embedding) == len(embed_reference[name])
    assert list(reply.embedding) == pytest.approx(embed_reference[name], abs=1e-5)


async def test_embedding_model_refuses_generate_and_bad_input(stub: Any) -> None:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert not info.is_generation
    generate = pb.GenerateRequest(
        request_id="g", tokenized=pb.TokenizedInput(input_ids=[1, 2]),
        sampling_params=pb.SamplingParams(max_new_tokens=2),
    )  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stub.Generate(generate)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for bad in ([], [1, 4096]):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Embed(
                pb.EmbedRequest(request_id="bad", tokenized=pb.TokenizedInput(input_ids=bad))
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy, health.message

"""Real SGLang (CPU) publishing real KV events, relayed by SubscribeKvEvents through the bridge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

from smg_it.kv import KvEvents, kv_prompt
from smg_it.sglang_suite import Server
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def stub(kv_server: Server) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(kv_server.address) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


def prompt(seed: int, length: int = 300) -> list[int]:
    return kv_prompt(seed, length)


async def generate(stub: Any, ids: list[int]) -> list[int]:
    """The prompt and the tokens generated for it (what the engine's KV cache holds of it)."""
    req = pb.GenerateRequest(
        request_id=f"kv-{ids[0]}-{len(ids)}-{id(ids)}",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(max_new_tokens=2, ignore_eos=True),
    )
    out: list[int] = []
    async for reply in stub.Generate(req):
        if reply.HasField("complete"):
            return [*ids, *(reply.complete.output_ids or out)]
        out.extend(reply.chunk.token_ids)
    return [*ids, *out]


def _holds(seq: list[int], run: list[int]) -> bool:
    return any(seq[i : i + len(run)] == run for i in range(len(seq) - len(run) + 1))


async def test_block_stored_and_removed_flow_through_the_servicer(stub: Any) -> None:
    kinds: set[str] = set()
    sent: list[list[int]] = []
    async with KvEvents(stub) as events:
        for attempt in range(40):  # the SUB needs a moment to join; keep sending distinct prompts
            ids = prompt(attempt)
            sent.append(await generate(stub, ids))
            await asyncio.sleep(0.05)
            kinds = events.kinds()
            if {"stored", "removed"} <= kinds and attempt >= 10:
                break
    assert {"stored", "removed"} <= kinds, kinds
    seqs = events.sequence_numbers()
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no duplicate, no hole"
    stored = events.stored()
    # Every stored block is a run of one of our sequences (prompt and output): nothing else ran.
    assert all(
        any(_holds(seq, list(b.token_ids)) for seq in sent) for s in stored for b in s.blocks
    ), "a stored block that is no run of a sequence sent"
    assert any(
        list(b.token_ids) == ids[: len(b.token_ids)]
        for s in stored
        if not s.HasField("parent_block_hash")
        for b in s.blocks[:1]
        for ids in sent
    ), "a root block holds the start of a prompt we sent"
    assert all(b.HasField("load") for b in events.batches), "every batch carries the engine load"


async def test_resume_from_a_cursor_replays_history(stub: Any) -> None:
    first = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
    seen: list[int] = []
    for attempt in range(30):
        await generate(stub, prompt(1000 + attempt, 40))
        try:
            batch = await asyncio.wait_for(first.read(), 0.5)
        except TimeoutError:
            continue
        if not batch.load.load_only:
            seen.append(batch.sequence_number)
        if len(seen) >= 2:
            break
    first.cancel()
    assert len(seen) >= 2
    cursor = seen[0]
    await generate(stub, prompt(2000, 40))
    second = stub.SubscribeKvEvents(
        common_pb2.SubscribeKvEventsRequest(start_sequence_number=cursor)
    )
    resumed = []
    while len(resumed) < 3:
        batch = await asyncio.wait_for(second.read(), 10)
        if not batch.load.load_only:
            resumed.append(batch.sequence_number)
    second.cancel()
    assert resumed == [cursor + 1, cursor + 2, cursor + 3], "replay from the cursor, in order"


async def test_every_info_field_is_sglangs_own(
    kv_server: Server, tiny_model: Path, walk_info: Any
) -> None:
    """The KV tests' server has a 2,048-token pool: the fields that follow it say so."""
    assert await walk_info(kv_server, tiny_model, total_tokens=2048) == []

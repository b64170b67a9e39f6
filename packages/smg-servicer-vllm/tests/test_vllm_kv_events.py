"""Real vLLM (CPU) publishing real KV events, relayed by SubscribeKvEvents through the bridge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from smg_it.harness import free_port
from smg_it.kv import KvEvents
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.testing import generate_request

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

BLOCK = 128  # vLLM's CPU block size


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def kv_llm(tiny_model: Path, make_llm: Any) -> AsyncIterator[Any]:
    """A small KV cache (16 blocks) so that new prompts evict old blocks: BlockRemoved."""
    from vllm.config import KVEventsConfig

    llm = make_llm(
        tiny_model,
        max_model_len=512,
        kv_cache_memory_bytes=16 * BLOCK * 1024,
        enable_prefix_caching=True,
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=f"tcp://*:{free_port()}",
            replay_endpoint=f"tcp://*:{free_port()}",
        ),
    )
    yield llm
    llm.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def kv_stack(kv_llm: Any, serve_llm: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with serve_llm(kv_llm) as stack:
        yield stack


async def test_block_stored_and_removed_flow_through_the_servicer(kv_stack) -> None:
    _, stub = kv_stack
    prompts = [[(p * 37 + i) % 4000 + 4 for i in range(2 * BLOCK + 10)] for p in range(10)]
    kinds: set[str] = set()
    async with KvEvents(stub) as events:
        for attempt in range(30):  # the SUB needs a moment to join; keep sending distinct prompts
            prompt = (
                prompts[attempt % len(prompts)]
                if attempt < 10
                else [(attempt * 53 + i) % 4000 + 4 for i in range(2 * BLOCK + 10)]
            )
            call = stub.Generate(generate_request("vllm", prompt, max_tokens=2, ignore_eos=True))
            async for _ in call:
                pass
            await asyncio.sleep(0.1)
            kinds = events.kinds()
            if {"stored", "removed"} <= kinds:
                break
    assert {"stored", "removed"} <= kinds, kinds
    seqs = events.sequence_numbers()
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no duplicate, no hole"
    stored = events.stored()
    sent = {tuple(p[:BLOCK]) for p in prompts} | {
        tuple((a * 53 + i) % 4000 + 4 for i in range(BLOCK)) for a in range(30)
    }
    first_blocks = [
        tuple(s.blocks[0].token_ids) for s in stored if not s.HasField("parent_block_hash")
    ]
    assert first_blocks and all(block in sent for block in first_blocks)
    assert all(b.block_size == BLOCK for s in stored for b in s.blocks)
    assert all(b.HasField("load") for b in events.batches), "every batch carries the engine load"


async def test_kv_events_off_is_unimplemented(vllm_stack) -> None:
    _, stub = vllm_stack
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest()):
            pass
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "--kv-events-config" in (info.value.details() or "")


async def test_resume_from_a_cursor_replays_history(kv_stack) -> None:
    _, stub = kv_stack
    first = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
    seen: list[int] = []
    for attempt in range(30):
        prompt = [(attempt * 71 + i) % 4000 + 4 for i in range(BLOCK + 5)]
        async for _ in stub.Generate(generate_request("vllm", prompt, max_tokens=1)):
            pass
        try:
            batch = await asyncio.wait_for(first.read(), 0.5)
        except TimeoutError:
            continue
        seen.append(batch.sequence_number)
        if len(seen) >= 2:
            break
    first.cancel()
    assert len(seen) >= 2
    cursor = seen[0]
    resumed = stub.SubscribeKvEvents(
        common_pb2.SubscribeKvEventsRequest(start_sequence_number=cursor)
    )
    batch = await asyncio.wait_for(resumed.read(), 10)
    assert batch.sequence_number == cursor + 1, "history right after the cursor, from replay"
    resumed.cancel()

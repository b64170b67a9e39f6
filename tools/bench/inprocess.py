"""The in-process side of the engine comparisons: drive an engine's own async API with
smg_bench's workload and summarise it in smg_bench's terms. Standard library only, so the
per-engine scripts can use it from any environment (they run as files from this folder)."""

from __future__ import annotations

import asyncio
import functools
import gc
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

#: ``stream(i)`` generates request ``i`` and yields its completion-token count so far.
Stream = Callable[[int], AsyncIterator[int]]


@functools.cache
def freeze_heap() -> None:
    """Take the start-up heap out of full collections, once, as the servicers do when their engine
    is ready (``smg_servicer_core.gcheap``) and vLLM's HTTP server does after start-up: otherwise
    the baseline pays stop-the-world collections over the engine's start-up objects (340 ms each in
    vLLM's process) that the servicer does not."""
    gc.collect()
    gc.freeze()


def prompt(i: int, prompt_len: int) -> list[int]:
    """smg_bench's prompt ids for request ``i``."""
    return [(i * 13 + k) % 1000 + 10 for k in range(prompt_len)]


async def drive(label: str, concurrency: int, requests: int, stream: Stream) -> dict[str, Any]:
    """``requests`` requests, ``concurrency`` in flight; TTFT, throughput, held-back share."""
    freeze_heap()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    ttfts: list[float] = []
    held = 0
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens, held
        start = time.perf_counter()
        first = None
        count = 0
        async for count in stream(i):
            if count and first is None:
                first = time.perf_counter() - start
        tokens += count
        total = time.perf_counter() - start
        ttfts.append(first or total)
        held += int(first is not None and first > total / 2)

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    begin = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - begin
    q = statistics.quantiles(ttfts, n=100, method="inclusive") if len(ttfts) > 1 else ttfts * 99
    return {
        "label": label,
        "concurrency": concurrency,
        "requests": requests,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms_p50": round(q[49] * 1000, 3),
        "ttft_ms_p99": round(q[98] * 1000, 3),
        "held_back_share": round(held / requests, 4),
    }

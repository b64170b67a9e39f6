"""A slow reader: one client reads its stream at 1 message/s for 30 s (``SMG_SLOW_READER_S``) while
16 others stream at full speed. The others' throughput and inter-chunk p99 stay within 10 % of a
run without it, and the worker's memory stays bounded. The runs without it are taken just before
and just after; the figures are against their mean, the check against the worse of the two (on a
shared machine two runs without the slow reader already differ by several percent). A timing miss
is measured again once, the second sequence deciding (a CI run saw a p99 17 % over from one
scheduling burst); an impact of the slow reader misses both times. Errors, a reader that did not
read and memory growth fail at once.

The slow stream is an ordinary request (256 tokens, more than it reads in 30 s): the engine
generates it at its own pace while the reader falls behind, so what differs from the runs without
it is the reading, not the engine's work. (With a slow request as long as the context, the others
lost 6-23 % of their throughput on MLX: that request held a batch slot for 2,040 decode steps,
engine work the runs without it did not have.)

The bound, and how it holds: a stream nobody reads stops the servicer's generator at its next
``yield`` once gRPC's flow-control window (64 KiB per stream) is full. The engine keeps
generating that request to its ``max_tokens``, so what waits is at most ``max_tokens`` outputs in
the request's own queue (vLLM's output collector merges them into one; MLX, SGLang and TokenSpeed
queue one entry per step): per stream, bounded by the context length. The worker's process-tree
RSS growth during the run is recorded and must stay under :data:`RSS_BOUND`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field

import grpc
import grpc.aio
import pytest

from smg_it.reliability import Target, record

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

SLOW_S = float(os.environ.get("SMG_SLOW_READER_S", "30"))
BASELINE_S = SLOW_S / 3
FAST = 16
FAST_TOKENS = 128
SLOW_TOKENS = 256
#: Impact allowed on the fast streams (throughput down, inter-chunk p99 up).
IMPACT_BOUND = 0.10
RSS_BOUND = 64 << 20


@dataclass
class Load:
    tokens: int = 0
    gaps: list[float] = field(default_factory=list[float])
    errors: int = 0

    def p99(self) -> float:
        return statistics.quantiles(self.gaps, n=100, method="inclusive")[98]


async def fast_load(target: Target, stub: object, seconds: float) -> tuple[Load, float]:
    load = Load()
    stop_at = time.monotonic() + seconds

    async def client(index: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            request = target.request(
                [1, 2, index + 3, n % 50 + 4], max_tokens=FAST_TOKENS, stream=True, ignore_eos=True
            )
            last = None
            try:
                async for message in stub.Generate(request, timeout=120):  # type: ignore[attr-defined]
                    now = time.perf_counter()
                    if message.HasField("chunk") and message.chunk.token_ids:
                        load.tokens += len(message.chunk.token_ids)
                        if last is not None:
                            load.gaps.append(now - last)
                        last = now
            except grpc.aio.AioRpcError:
                load.errors += 1

    started = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(FAST)))
    return load, time.monotonic() - started


async def slow_reader(target: Target, stub: object, seconds: float) -> int:
    """Reads one message a second; cancels its call at the end (a client that gave up)."""
    request = target.request([7, 8, 9], max_tokens=SLOW_TOKENS, stream=True, ignore_eos=True)
    call = stub.Generate(request, timeout=seconds + 120)  # type: ignore[attr-defined]
    read = 0
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        if await call.read() is grpc.aio.EOF:
            break
        read += 1
        await asyncio.sleep(1.0)
    call.cancel()
    return read


@dataclass
class Attempt:
    """One before / with the slow reader / after sequence, and what it showed."""

    figures: dict[str, float]
    #: Timing bounds missed (throughput, inter-chunk p99): noise can cause these on a shared
    #: machine, so a miss is measured again once; a real impact misses both times.
    misses: list[str]
    #: Hard failures (errors, a reader that did not read, memory): never measured again.
    faults: list[str]


async def attempt(shared: Target, fast: object, slow: object) -> Attempt:
    before, before_s = await fast_load(shared, fast, BASELINE_S)
    rss_before = shared.tree_rss()
    reader = asyncio.create_task(slow_reader(shared, slow, SLOW_S))
    with_slow, with_slow_s = await fast_load(shared, fast, SLOW_S)
    rss_during = shared.tree_rss()
    read = await reader
    after, after_s = await fast_load(shared, fast, BASELINE_S)
    rates = (before.tokens / before_s, after.tokens / after_s)
    p99s = (before.p99(), after.p99())
    rate = with_slow.tokens / with_slow_s
    rss_growth = rss_during - rss_before
    figures = {
        "slow_reader_read": read,
        "slow_throughput_ratio": round(rate / statistics.mean(rates), 3),
        "slow_itl_p99_ratio": round(with_slow.p99() / statistics.mean(p99s), 3),
        "slow_itl_p99_ms": round(with_slow.p99() * 1000, 2),
        "slow_base_itl_p99_ms": round(statistics.mean(p99s) * 1000, 2),
        "slow_base_spread": round(max(rates) / min(rates) - 1, 3),
        "slow_rss_growth_mb": round(rss_growth / 2**20, 1),
    }
    misses, faults = [], []
    if rate < min(rates) * (1 - IMPACT_BOUND):
        misses.append(f"throughput {rate:.0f} vs {rates}")
    if with_slow.p99() > max(p99s) * (1 + IMPACT_BOUND):
        misses.append(f"p99 {with_slow.p99()} vs {p99s}")
    if before.errors or with_slow.errors or after.errors:
        faults.append(f"errors {before.errors}, {with_slow.errors}, {after.errors}")
    if read < SLOW_S * 0.8:
        faults.append(f"the slow reader read {read} messages in {SLOW_S}s")
    if rss_growth > RSS_BOUND:
        faults.append(f"RSS grew {rss_growth >> 20} MiB")
    return Attempt(figures, misses, faults)


async def test_a_slow_reader_does_not_slow_the_others(shared: Target) -> None:
    async with (
        grpc.aio.insecure_channel(shared.address) as fast_channel,
        grpc.aio.insecure_channel(shared.address) as slow_channel,
    ):
        fast, slow = shared.stub(fast_channel), shared.stub(slow_channel)
        await fast_load(shared, fast, 2)  # warm-up
        first = await attempt(shared, fast, slow)
        final = first
        if first.misses and not first.faults:
            final = await attempt(shared, fast, slow)
    record(
        shared.engine,
        slow_reader_s=SLOW_S,
        **final.figures,
        slow_attempts=1 + (final is not first),
        slow_first_misses="; ".join(first.misses),
    )
    assert not final.faults, final.faults
    assert not final.misses, (
        f"twice over the {IMPACT_BOUND:.0%} bound: {first.misses}, {final.misses}"
    )
    assert shared.wait_idle() == (0, 0, 0)

"""A slow reader: one client reads its stream at 1 message/s for ``SMG_SLOW_READER_S`` (6 s in the
gate) while 16 others stream at full speed, with runs without it just before and just after.

What the gate asserts is behaviour, never a ratio of wall-clock figures (a busy 2-core machine
trips those with nothing wrong in the code): every fast stream ends OK with exactly its
``max_tokens`` tokens and no error, the slow reader keeps being served (it reads messages, without
an error, until it gives up), the worker's process-tree RSS grows by less than :data:`RSS_BOUND`,
and afterwards nothing is left in flight.

The timing impact (the others' throughput and inter-chunk p99 against the runs without the slow
reader) is measured and written to the figures file; its bounds (within 10 %, on the median of
alternated rounds) are checked by the benchmark command, ``bash tools/bench/reliability.sh``
(``SMG_SLOW_READER_ROUNDS`` rounds of 30 s, then ``tools/reliability_report.py --check --bench``).

The slow stream is an ordinary request (256 tokens, more than it reads in 30 s): the engine
generates it at its own pace while the reader falls behind, so what differs from the runs without
it is the reading, not the engine's work. (With a slow request as long as the context, the others
lost 6-23 % of their throughput on MLX: that request held a batch slot for 2,040 decode steps,
engine work the runs without it did not have.)

The bound, and how it holds: a stream nobody reads stops the servicer's generator at its next
``yield`` once gRPC's flow-control window (64 KiB per stream) is full. The engine keeps
generating that request to its ``max_tokens``, so what waits is at most ``max_tokens`` outputs in
the request's own queue (vLLM's output collector merges them into one; MLX, SGLang and TokenSpeed
queue one entry per step): per stream, bounded by the context length.
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

from smg_bench import spread as ratio_spread
from smg_it.reliability import Target, record

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

SLOW_S = float(os.environ.get("SMG_SLOW_READER_S", "6"))
#: Alternated (before, with, after) rounds; the benchmark runs several to state a spread.
ROUNDS = max(int(os.environ.get("SMG_SLOW_READER_ROUNDS", "1")), 1)
BASELINE_S = SLOW_S / 3
FAST = 16
FAST_TOKENS = 128
SLOW_TOKENS = 256
RSS_BOUND = 64 << 20
#: The slow reader reads one message a second; it must get at least this many (a bound far below
#: the ``SLOW_S`` it reads in a healthy run: it proves the stream is served, not how fast).
SLOW_READS = 3


@dataclass
class Load:
    tokens: int = 0
    gaps: list[float] = field(default_factory=list[float])
    errors: list[str] = field(default_factory=list[str])
    #: Streams that ended OK with a token count other than their ``max_tokens``.
    short: list[int] = field(default_factory=list[int])
    streams: int = 0

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
            last, tokens = None, 0
            try:
                async for message in stub.Generate(request, timeout=120):  # type: ignore[attr-defined]
                    now = time.perf_counter()
                    if message.HasField("chunk") and message.chunk.token_ids:
                        tokens += len(message.chunk.token_ids)
                        if last is not None:
                            load.gaps.append(now - last)
                        last = now
            except grpc.aio.AioRpcError as err:
                load.errors.append(err.code().name)
                continue
            load.tokens += tokens
            load.streams += 1
            if tokens != FAST_TOKENS:
                load.short.append(tokens)

    started = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(FAST)))
    return load, time.monotonic() - started


async def slow_reader(
    target: Target, stub: object, seconds: float, pause_s: float = 1.0
) -> tuple[int, str]:
    """Reads one message every ``pause_s``; cancels its call at the end (a client that gave up).
    (messages read, how the stream ended while it read: OK, EOF or a status name). With
    ``pause_s`` 0 it is the benchmark's control: the same request, read at full speed."""
    request = target.request([7, 8, 9], max_tokens=SLOW_TOKENS, stream=True, ignore_eos=True)
    call = stub.Generate(request, timeout=seconds + 120)  # type: ignore[attr-defined]
    read, ending = 0, "OK"
    stop_at = time.monotonic() + seconds
    try:
        while time.monotonic() < stop_at:
            if await call.read() is grpc.aio.EOF:
                ending = "EOF"
                break
            read += 1
            await asyncio.sleep(pause_s)
    except grpc.aio.AioRpcError as err:
        ending = err.code().name
    call.cancel()
    return read, ending


@dataclass
class Round:
    """One before / with the slow reader / after sequence."""

    loads: tuple[Load, Load, Load]
    throughput_ratio: float
    p99_ratio: float
    p99_ms: float
    base_p99_ms: float
    base_spread: float
    read: int
    ending: str
    rss_growth: int
    #: With several rounds (the benchmark), the slow phase against a control phase of the same
    #: length in which the same extra request is read at full speed: the engine's work is the
    #: same in both, so what these ratios show is the reading alone (a slow reader holding up
    #: a shared output path would show here; an extra request's engine work would not).
    vs_control: tuple[float, float] | None = None


async def with_extra(
    shared: Target, fast: object, slow: object, pause_s: float
) -> tuple[Load, float, int, str, int]:
    """The fast load for ``SLOW_S`` beside one extra request read every ``pause_s``; the load,
    its duration, what the extra reader read, how its stream ended, the RSS growth."""
    rss_before = shared.tree_rss()
    reader = asyncio.create_task(slow_reader(shared, slow, SLOW_S, pause_s))
    load, seconds = await fast_load(shared, fast, SLOW_S)
    rss_growth = shared.tree_rss() - rss_before
    read, ending = await reader
    return load, seconds, read, ending, rss_growth


async def one_round(shared: Target, fast: object, slow: object, control: bool) -> Round:
    before, before_s = await fast_load(shared, fast, BASELINE_S)
    with_slow, with_slow_s, read, ending, rss_growth = await with_extra(shared, fast, slow, 1.0)
    vs_control = None
    if control:
        ctl, ctl_s, _, _, _ = await with_extra(shared, fast, slow, 0.0)
        vs_control = (
            with_slow.tokens / with_slow_s / (ctl.tokens / ctl_s),
            with_slow.p99() / ctl.p99(),
        )
    after, after_s = await fast_load(shared, fast, BASELINE_S)
    rates = (before.tokens / before_s, after.tokens / after_s)
    base_p99 = statistics.mean((before.p99(), after.p99()))
    return Round(
        loads=(before, with_slow, after),
        throughput_ratio=with_slow.tokens / with_slow_s / statistics.mean(rates),
        p99_ratio=with_slow.p99() / base_p99,
        p99_ms=with_slow.p99() * 1000,
        base_p99_ms=base_p99 * 1000,
        base_spread=max(rates) / min(rates) - 1,
        read=read,
        ending=ending,
        rss_growth=rss_growth,
        vs_control=vs_control,
    )


def figures(rounds: list[Round]) -> dict[str, object]:
    """The timing figures (median over the rounds, with their range): the benchmark's
    ``tools/reliability_report.py --check --bench`` holds them to their bounds."""

    def spread(name: str, values: list[float]) -> dict[str, float]:
        """The benchmarks' one ratio rule (``smg_bench.spread``), keyed by the figure's name."""
        stated = ratio_spread(values, name)
        return {name: stated[name], f"{name}_min": stated["ratio_min"],
                f"{name}_max": stated["ratio_max"]}  # fmt: skip

    controls = [r.vs_control for r in rounds if r.vs_control is not None]
    versus = (
        {
            **spread("slow_vs_control_throughput_ratio", [c[0] for c in controls]),
            **spread("slow_vs_control_itl_p99_ratio", [c[1] for c in controls]),
        }
        if controls
        else {}
    )
    return {
        **versus,
        "slow_rounds": len(rounds),
        "slow_reader_read": min(r.read for r in rounds),
        **spread("slow_throughput_ratio", [r.throughput_ratio for r in rounds]),
        **spread("slow_itl_p99_ratio", [r.p99_ratio for r in rounds]),
        "slow_itl_p99_ms": round(statistics.median(r.p99_ms for r in rounds), 2),
        "slow_base_itl_p99_ms": round(statistics.median(r.base_p99_ms for r in rounds), 2),
        "slow_base_spread": round(max(r.base_spread for r in rounds), 3),
        "slow_rss_growth_mb": round(max(r.rss_growth for r in rounds) / 2**20, 1),
    }


#: Each round: before, with the slow reader, (the control), after; twice that, plus a margin.
ROUND_S = 2 * BASELINE_S + SLOW_S * (2 if ROUNDS > 1 else 1)


@pytest.mark.timeout(120 + 2 * ROUNDS * ROUND_S)
async def test_a_slow_reader_does_not_slow_the_others(shared: Target) -> None:
    async with (
        grpc.aio.insecure_channel(shared.address) as fast_channel,
        grpc.aio.insecure_channel(shared.address) as slow_channel,
    ):
        fast, slow = shared.stub(fast_channel), shared.stub(slow_channel)
        await fast_load(shared, fast, 2)  # warm-up
        rounds = [await one_round(shared, fast, slow, ROUNDS > 1) for _ in range(ROUNDS)]
    record(shared.engine, slow_reader_s=SLOW_S, **figures(rounds))
    loads = [load for r in rounds for load in r.loads]
    assert all(load.streams for load in loads), "a load phase completed no stream"
    assert not [e for load in loads for e in load.errors], [load.errors for load in loads]
    assert not [n for load in loads for n in load.short], (
        f"streams ended OK without their {FAST_TOKENS} tokens: {[ld.short for ld in loads]}"
    )
    for r in rounds:
        assert r.ending in ("OK", "EOF"), f"the slow stream ended {r.ending} while it was read"
        assert r.read >= SLOW_READS, f"the slow reader got {r.read} messages in {SLOW_S} s"
        assert r.rss_growth <= RSS_BOUND, f"RSS grew {r.rss_growth >> 20} MiB"
    assert shared.wait_idle() == (0, 0, 0)

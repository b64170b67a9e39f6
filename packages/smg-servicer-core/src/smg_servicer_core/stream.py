"""Adaptive coalescing: how a ``Generate`` stream hands engine output to gRPC.

``grpc.aio`` takes one message per stream at a time: a servicer's generator is resumed for its
next message only once gRPC has taken the previous one (one completion through gRPC's poller
thread and one event-loop wake-up per message, about three quarters of a streamed token's cost).
So every engine adapter keeps its request's output in a buffer the engine fills on its own
schedule, and the stream takes **everything waiting** each time it is resumed:

- a stream that keeps up finds one step waiting and sends it at once (one token per message);
- a stream whose previous message is still with gRPC, or whose engine handed over several steps
  at once, finds them all and sends them as one chunk (ids, logprobs and counts together).

Nothing waits for more: there is no timer on this path, and a token is never held back for
company. Where the buffer lives, per engine: vLLM's own ``RequestOutputCollector`` (it merges
DELTA outputs while the reader is behind), SGLang's per-request state in the request manager,
TokenSpeed's per-call queue, MLX's per-request queue.

``SMG_STREAM_COALESCE=0`` sends one message per engine step (per token) instead, on every engine:
for a client that cannot take several tokens per chunk (the SMG router can), and for comparing the
two. It is read when a servicer is built.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from smg_servicer_core.config import Setting, parse_bool, setting_value

T = TypeVar("T")

COALESCE = Setting(
    "stream_coalesce",
    parse_bool,
    True,
    "send every engine step waiting for a stream as one message (0: one message per step)",
    env="SMG_STREAM_COALESCE",
)


def coalescing() -> bool:
    """Whether streams coalesce (``SMG_STREAM_COALESCE``, default on)."""
    return setting_value(COALESCE)


async def take_waiting(queue: asyncio.Queue[T], coalesce: bool = True) -> list[T]:
    """The next item of ``queue`` (waiting for it), then, when coalescing, every item already
    waiting behind it; never waits for a second item."""
    batch = [await queue.get()]
    if coalesce:
        while not queue.empty():
            batch.append(queue.get_nowait())
    return batch

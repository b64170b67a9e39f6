"""The metrics hook's own CPU per streamed message, in process and without gRPC, so that a cost
of a microsecond can be seen on a machine whose whole-server figures move by ±10 % between runs.

    uv run python tools/bench/metrics_hook_cost.py [--streams 2000] [--repeats 7]

A servicer method decorated with ``@grpc_errors`` yields 128 prebuilt one-token chunks (the worst
case: one token per message) per call; the same streams run with ``metrics`` None and with a
``ServicerMetrics``, alternated (off, on, on, off, ...). Prints one JSON line: process CPU per
message for each arm (median and best of the repeats) and the difference, in microseconds. Divide
the difference by ``server_cpu_ms_per_1k_tokens`` from ``smg_bench.py`` (microseconds per token)
for the share of the servicer's per-token cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from smg_grpc_proto.generated import mlx_engine_pb2 as pb

from smg_servicer_core.errors import grpc_errors
from smg_servicer_core.metrics import ServicerMetrics

TOKENS = 128
CHUNKS = [
    pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[i], completion_tokens=i + 1))
    for i in range(TOKENS)
] + [pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="length"))]


class _Servicer:
    def __init__(self, metrics: ServicerMetrics | None) -> None:
        self.metrics = metrics

    @grpc_errors
    async def Generate(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        for chunk in CHUNKS:
            yield chunk


async def _per_message_us(servicer: _Servicer, streams: int) -> float:
    start = time.process_time()
    for _ in range(streams):
        async for _ in servicer.Generate(None, None):
            pass
    return (time.process_time() - start) / (streams * len(CHUNKS)) * 1e6


async def _measure(streams: int, repeats: int) -> dict[str, Any]:
    off: list[float] = []
    on: list[float] = []
    for repeat in range(repeats):
        arms = [(off, None), (on, ServicerMetrics())]
        for results, metrics in arms if repeat % 2 == 0 else arms[::-1]:
            results.append(await _per_message_us(_Servicer(metrics), streams))
    diffs = [b - a for a, b in zip(off, on, strict=True)]
    return {
        "messages_per_arm_run": streams * len(CHUNKS),
        "off_us_per_message": {
            "median": round(statistics.median(off), 3),
            "best": round(min(off), 3),
        },
        "on_us_per_message": {"median": round(statistics.median(on), 3), "best": round(min(on), 3)},
        "hook_us_per_message": {
            "median": round(statistics.median(diffs), 3),
            "spread": [round(min(diffs), 3), round(max(diffs), 3)],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_measure(args.streams, args.repeats))))


if __name__ == "__main__":
    main()

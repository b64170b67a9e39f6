"""What metrics and tracing cost the servicer: process CPU per streamed token, in process and
without gRPC, each arm against the same servicer with both off.

    uv run python tools/bench/observability_cost.py [--streams 1000] [--rounds 7]

A servicer method decorated with ``@grpc_errors`` (core's wrapper, where metrics and request spans
are recorded) yields 128 prebuilt one-token chunks and a ``complete`` per call: one token per
message, the worst case for a per-message hook. The arms:

| arm | metrics | tracing | the call carries trace context |
|---|---|---|---|
| ``off`` | no | no | no |
| ``metrics`` | ``ServicerMetrics`` | no | no |
| ``tracing, no context`` | no | on | no |
| ``tracing, traced`` | no | on | yes: one span per call |
| ``both, traced`` | yes | on | yes |

Spans go over OTLP gRPC to a collector in a child process (core's test-kit ``OtlpReceiver``), so
this process's CPU is the servicer's, the SDK's and its exporter's, not the collector's. Every
round runs every arm once, in an order rotated by one each round, so that a drift in the machine's
load favours no arm. Prints one JSON line per arm and round: ``{"round", "arm",
"us_per_token", "tokens"}``; :func:`markdown` reads them (``tools/bench/summarize.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from smg_grpc_proto.generated import mlx_engine_pb2 as pb

from smg_servicer_core.errors import grpc_errors
from smg_servicer_core.metrics import ServicerMetrics
from smg_servicer_core.tracing import Tracing

TOKENS = 128
CHUNKS = [
    pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[i], completion_tokens=i + 1))
    for i in range(TOKENS)
] + [
    pb.GenerateResponse(
        complete=pb.GenerateComplete(
            finish_reason="length", prompt_tokens=8, completion_tokens=TOKENS
        )
    )
]
REQUEST = pb.GenerateRequest(request_id="bench", sampling_params=pb.SamplingParams(max_tokens=128))
TRACED = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
ARMS = ("off", "metrics", "tracing, no context", "tracing, traced", "both, traced")
_RECEIVER = (
    "import sys\n"
    "from smg_servicer_core.testing.otlp import OtlpReceiver\n"
    "with OtlpReceiver() as r:\n"
    "    print(r.endpoint, flush=True)\n"
    "    sys.stdin.read()\n"
)


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


class _Servicer:
    def __init__(self, metrics: ServicerMetrics | None, tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    @grpc_errors
    async def Generate(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        for chunk in CHUNKS:
            yield chunk


@contextmanager
def _collector() -> Iterator[str]:
    """A collector in a child process: its endpoint (stopped when stdin closes)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        yield child.stdout.readline().strip()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


def _arm(name: str, tracing: Tracing) -> tuple[_Servicer, _Context]:
    metrics = ServicerMetrics() if name in ("metrics", "both, traced") else None
    traced = tracing if name.startswith(("tracing", "both")) else None
    context = _Context(TRACED if name.endswith("traced") else ())
    return _Servicer(metrics, traced), context


async def _us_per_token(servicer: _Servicer, context: _Context, streams: int) -> float:
    start = time.process_time()
    for _ in range(streams):
        async for _ in servicer.Generate(REQUEST, context):
            pass
    if servicer.tracing is not None:  # the export's CPU belongs to the arm that made the spans
        servicer.tracing.provider.force_flush()
    return (time.process_time() - start) / (streams * TOKENS) * 1e6


async def _run(streams: int, rounds: int, endpoint: str) -> None:
    tracing = Tracing(endpoint, "observability-cost")
    for arm in ARMS:  # warm-up: imports, the exporter's channel
        await _us_per_token(*_arm(arm, tracing), max(1, streams // 10))
    for r in range(rounds):
        order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]
        for arm in order:
            cost = await _us_per_token(*_arm(arm, tracing), streams)
            line = {"round": r, "arm": arm, "us_per_token": round(cost, 4)}
            print(json.dumps({**line, "tokens": streams * TOKENS}), flush=True)
    tracing.shutdown()


def markdown(rows: list[dict[str, Any]]) -> str:
    """Per arm: its CPU per token, and its extra over ``off`` in the same round (median and
    range over the rounds). No ratio: ``off`` is the bare wrapper, near zero, not a server."""
    by = {(r["round"], r["arm"]): r["us_per_token"] for r in rows if "arm" in r}
    rounds = sorted({r for r, _ in by})
    out = [
        f"Process CPU per streamed token, one token per message, {len(rounds)} rounds "
        "(median, min-max):",
        "",
        "| arm | µs per token | extra over `off` in its round, µs per token |",
        "|---|---|---|",
    ]
    for arm in ARMS:
        costs = [by[(r, arm)] for r in rounds]
        extra = [by[(r, arm)] - by[(r, "off")] for r in rounds]
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in (costs, extra)]
        if arm == "off":
            cells[1] = "-"
        out.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with _collector() as endpoint:
        asyncio.run(_run(args.streams, args.rounds, endpoint))


if __name__ == "__main__":
    main()

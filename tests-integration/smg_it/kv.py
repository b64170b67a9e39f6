"""Reading a worker's KV events (``SubscribeKvEvents``) while a test drives it.

async with KvEvents(stub) as events:
    ...  # send requests; events.kinds() grows as batches arrive
seqs = events.sequence_numbers()
"""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import Any

import grpc.aio

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.testing.process import free_port


def kv_events_config(engine: str) -> str:
    """``--kv-events-config`` for a worker: ZMQ on free loopback ports (a DP rank binds the port
    plus its rank); vLLM also needs ``enable_kv_cache_events``."""
    config: dict[str, object] = {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{free_port()}",
    }
    if engine == "vllm":
        config["enable_kv_cache_events"] = True
    return json.dumps(config)


def kv_prompt(seed: int, length: int) -> list[int]:
    """A prompt of ``length`` ids that differs by ``seed`` (so each fills new KV blocks)."""
    return [(seed * 53 + i * 7) % 4000 + 4 for i in range(length)]


class KvEvents:
    """One ``SubscribeKvEvents`` stream on ``stub`` (an aio stub of any wire), read into
    :attr:`batches` by a task of its own from entering until leaving (the call cancelled)."""

    def __init__(self, stub: Any, start_sequence_number: int = 0) -> None:
        self.stub = stub
        self.request = common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start_sequence_number
        )
        self.batches: list[common_pb2.KvEventBatch] = []
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        while (batch := await self._call.read()) is not grpc.aio.EOF:
            self.batches.append(batch)

    def kinds(self) -> set[str]:
        """The event kinds seen so far (``stored``, ``removed``, ``cleared``)."""
        return {str(e.WhichOneof("data")) for b in self.batches for e in b.events}

    def stored(self) -> list[Any]:
        """Every ``stored`` event seen so far, in order."""
        return [e.stored for b in self.batches for e in b.events if e.HasField("stored")]

    def sequence_numbers(self) -> list[int]:
        """The sequence numbers of the batches that carry events (not the load-only ones)."""
        return [b.sequence_number for b in self.batches if not b.load.load_only]

    async def __aenter__(self) -> KvEvents:
        self._call = self.stub.SubscribeKvEvents(self.request)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._call.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

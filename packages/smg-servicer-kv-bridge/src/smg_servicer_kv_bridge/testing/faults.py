"""KV-event faults against a servicer's real ``SubscribeKvEvents``, for every engine's tests.

    outcomes = await kv_fault_outcomes(open_stream, publisher)

``open_stream(start)`` opens the servicer's ``SubscribeKvEvents`` (a ``grpc.aio`` call over the
network) and ``publisher`` is the :class:`ScriptedPublisher` the servicer was configured to dial,
standing in for the engine's own (the one thing a fault can be injected into; the engines' own
publishers are proven by each engine's real KV-event tests). Each fault is run on a fresh
subscription:

- ``gap``: batches the SUB never saw, still in the publisher's history: repaired by replay,
  every number delivered once and in order (``OK``);
- ``replay_silent``: a gap while the replay endpoint answers nothing: DATA_LOSS (batches were
  already sent);
- ``resume_silent``: a resume from a cursor with the replay endpoint silent: OUT_OF_RANGE (none
  were);
- ``restart``: the publisher killed and bound again on its ports, numbering from 1: DATA_LOSS.

Each outcome is the final status code's name (``OK`` when the stream was still open and correct),
or ``BAD: ...`` naming a duplicate or missing sequence number.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

from smg_servicer_kv_bridge.testing.publisher import ScriptedPublisher, stored_event

EVENT = [stored_event([11, 12], [1, 2, 3, 4])]
EXPECTED = {
    "gap": "OK",
    "replay_silent": "DATA_LOSS",
    "resume_silent": "OUT_OF_RANGE",
    "restart": "DATA_LOSS",
}
#: Longer than the relay's replay timeout (5 s).
END_S = 20.0

OpenStream = Callable[[int], Any]


class _Reader:
    def __init__(self, call: Any) -> None:
        self.call = call
        self.seqs: list[int] = []
        self.code = "OK"
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for batch in self.call:
                if not batch.load.load_only:
                    self.seqs.append(int(batch.sequence_number))
        except Exception as exc:  # grpc.aio.AioRpcError: its code is the outcome
            code: Any = getattr(exc, "code", None)
            status: Any = code() if callable(code) else None
            self.code = str(getattr(status, "name", type(exc).__name__))

    async def until(self, predicate: Callable[[list[int]], bool], limit_s: float = 10.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        # The reader appends from its own task: polling a list is the simplest honest wait.
        while not predicate(self.seqs) and not self.task.done() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        return predicate(self.seqs)

    async def ended(self) -> str:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), END_S)
        return self.code if self.task.done() else "still open"

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _joined(pub: ScriptedPublisher, reader: _Reader) -> None:
    """Publish until the servicer's SUB has joined (ZMQ drops what is sent before)."""
    for _ in range(500):
        pub.publish(EVENT)
        if await reader.until(bool, 0.02):
            return
    raise AssertionError("the servicer's subscription never received a batch")


def _contiguous(seqs: list[int]) -> str:
    for before, after in itertools.pairwise(seqs):
        if after == before:
            return f"BAD: {after} delivered twice"
        if after != before + 1:
            return f"BAD: {before + 1}..{after - 1} missing"
    return "OK"


async def _gap(open_stream: OpenStream, pub: ScriptedPublisher) -> str:
    reader = _Reader(open_stream(0))
    try:
        await _joined(pub, reader)
        base = pub.next_seq - 1
        body = pub.history[-1][1]
        pub.history.extend([(base + 1, body), (base + 2, body)])  # never sent live
        pub.next_seq = base + 3
        pub.publish(EVENT)
        pub.publish(EVENT)
        if not await reader.until(lambda s: bool(s) and s[-1] >= base + 4):
            return f"BAD: stuck at {reader.seqs[-3:]} ({reader.code})"
        return _contiguous(reader.seqs) if not reader.task.done() else reader.code
    finally:
        await reader.close()


async def _replay_silent(open_stream: OpenStream, pub: ScriptedPublisher) -> str:
    reader = _Reader(open_stream(0))
    try:
        await _joined(pub, reader)
        pub.replay_mode = "timeout"
        pub.next_seq += 3
        pub.publish(EVENT)
        code = await reader.ended()
        bad = _contiguous(reader.seqs)
        return code if bad == "OK" else bad
    finally:
        pub.replay_mode = "normal"
        await reader.close()


async def _resume_silent(open_stream: OpenStream, pub: ScriptedPublisher) -> str:
    pub.publish(EVENT)
    cursor = pub.next_seq - 1
    pub.replay_mode = "timeout"
    reader = _Reader(open_stream(cursor))
    try:
        code = await reader.ended()
        return code if not reader.seqs else f"BAD: {len(reader.seqs)} batches before {code}"
    finally:
        pub.replay_mode = "normal"
        await reader.close()


async def _restart(open_stream: OpenStream, pub: ScriptedPublisher) -> str:
    pub.next_seq = max(pub.next_seq, 100)
    reader = _Reader(open_stream(0))
    try:
        await _joined(pub, reader)
        await pub.kill_and_restart()
        for _ in range(500):  # the SUB reconnects by itself; publish until it hears seq 1...
            pub.publish(EVENT)
            if reader.task.done():
                break
            await asyncio.sleep(0.02)
        code = await reader.ended()
        bad = _contiguous(reader.seqs)
        return code if bad == "OK" else bad
    finally:
        await reader.close()


FAULTS = {
    "gap": _gap,
    "replay_silent": _replay_silent,
    "resume_silent": _resume_silent,
    "restart": _restart,
}


async def kv_fault_outcomes(
    open_stream: OpenStream, publisher: ScriptedPublisher
) -> dict[str, str]:
    """Every fault in :data:`FAULTS`, in order, on fresh subscriptions: fault -> outcome."""
    outcomes: dict[str, str] = {}
    for name, fault in FAULTS.items():
        outcomes[name] = await fault(open_stream, publisher)
    return outcomes

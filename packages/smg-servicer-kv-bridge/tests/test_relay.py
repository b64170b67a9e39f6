"""Every relay path against a scripted publisher on real ZMQ sockets: exact sequences delivered
(no duplicate, no hole) and the exact status code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smg_servicer_core.errors import DataLoss, OutOfRange, Unsupported
from smg_servicer_core.proto import common_pb2 as pb
from smg_servicer_kv_bridge import KvRelay, KvSource
from smg_servicer_kv_bridge.testing import ScriptedPublisher, stored_event

pytestmark = pytest.mark.contract

EVENT = [stored_event([11, 12], [1, 2, 3, 4])]


def source(pub: ScriptedPublisher, rank: int = 0) -> KvSource:
    return KvSource(rank=rank, endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint)


class Reader:
    """Consumes a relay stream in the background; records batches or the final error."""

    def __init__(self, stream: AsyncIterator[pb.KvEventBatch]) -> None:
        self.batches: list[pb.KvEventBatch] = []
        self.error: BaseException | None = None
        self._stream = stream
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for batch in self._stream:
                self.batches.append(batch)
        except Exception as exc:
            self.error = exc

    @property
    def seqs(self) -> list[int]:
        return [b.sequence_number for b in self.batches if not b.load.load_only]

    async def until(self, predicate: Any, limit_s: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + limit_s
        while not predicate(self):
            assert asyncio.get_running_loop().time() < deadline, f"stuck at {self.seqs}"
            assert not self.task.done() or predicate(self), f"stream ended: {self.error!r}"
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def joined(pub: ScriptedPublisher, reader: Reader) -> None:
    """Publish probe batches until the SUB has joined (ZMQ drops what is sent before)."""
    for _ in range(200):
        pub.publish(EVENT)
        await asyncio.sleep(0.02)
        if reader.batches:
            return
    raise AssertionError("subscriber never joined")


async def test_in_order_batches_keep_publisher_sequences() -> None:
    async with ScriptedPublisher() as pub:
        reader = Reader(KvRelay([source(pub)]).stream(0))
        await joined(pub, reader)
        first = reader.seqs[0]
        for _ in range(20):
            pub.publish(EVENT)
        await reader.until(lambda r: len(r.seqs) >= 21)
        assert reader.seqs == list(range(first, first + 21))
        stored = reader.batches[0].events[0].stored
        assert [b.block_hash for b in stored.blocks] == [11, 12]
        assert [list(b.token_ids) for b in stored.blocks] == [[1, 2], [3, 4]]
        assert reader.batches[0].dp_rank == 0
        await reader.close()


async def test_gap_is_repaired_by_replay() -> None:
    async with ScriptedPublisher() as pub:
        reader = Reader(KvRelay([source(pub)]).stream(0))
        await joined(pub, reader)
        base = pub.next_seq - 1
        pub.publish(EVENT, record=True)  # base+1 delivered
        pub.history.append((base + 2, pub.history[-1][1]))  # base+2 never reaches the SUB
        pub.history.append((base + 3, pub.history[-1][1]))
        pub.next_seq = base + 4
        pub.publish(EVENT)  # base+4 arrives live: a gap of two
        pub.publish(EVENT)
        await reader.until(lambda r: r.seqs and r.seqs[-1] >= base + 5)
        tail = [s for s in reader.seqs if s > base]
        assert tail == [base + 1, base + 2, base + 3, base + 4, base + 5]
        assert pub.replay_requests == [base + 2]
        await reader.close()


@pytest.mark.parametrize(
    ("mode", "words"),
    [("timeout", "timed out"), ("malformed", "malformed"), ("empty", "empty replay")],
)
async def test_replay_failure_mid_stream_is_data_loss(mode: str, words: str) -> None:
    async with ScriptedPublisher() as pub:
        relay = KvRelay([source(pub)], replay_timeout_s=0.5)
        reader = Reader(relay.stream(0))
        await joined(pub, reader)
        pub.replay_mode = mode  # type: ignore[assignment]
        pub.next_seq += 3  # a gap
        pub.publish(EVENT)
        await asyncio.wait_for(reader.task, 10)
        assert isinstance(reader.error, DataLoss)
        assert words in str(reader.error)


async def test_resume_from_cursor_replays_then_goes_live_without_overlap() -> None:
    async with ScriptedPublisher() as pub:
        for _ in range(10):
            pub.publish(EVENT)  # 1..10 before anyone subscribes
        reader = Reader(KvRelay([source(pub)]).stream(6))  # the router last saw 6
        await reader.until(lambda r: len(r.seqs) >= 4)
        assert reader.seqs[:4] == [7, 8, 9, 10]
        assert pub.replay_requests == [6]
        for _ in range(5):
            pub.publish(EVENT)  # 11..15 live
        await reader.until(lambda r: r.seqs[-1] >= 15)
        assert reader.seqs == list(range(7, 16)), "no duplicate and no hole at the hand-off"
        await reader.close()


async def test_overlap_at_hand_off_is_dropped() -> None:
    async with ScriptedPublisher() as pub:
        for _ in range(5):
            pub.publish(EVENT)
        relay = KvRelay([source(pub)])
        reader = Reader(relay.stream(2))
        await reader.until(lambda r: len(r.seqs) >= 3)  # 3, 4, 5 from history
        # Batches published while the replay ran reach the SUB too; re-send 4 and 5 live as an
        # engine would have, then new ones.
        pub.publish(EVENT, seq=4, record=False)
        pub.publish(EVENT, seq=5, record=False)
        pub.publish(EVENT)  # 6
        await reader.until(lambda r: r.seqs[-1] >= 6)
        assert reader.seqs == [3, 4, 5, 6]
        assert relay.stats.duplicates >= 2
        await reader.close()


@pytest.mark.parametrize("mode", ["timeout", "malformed", "empty"])
async def test_resume_failure_before_streaming_is_out_of_range(mode: str) -> None:
    async with ScriptedPublisher() as pub:
        for _ in range(3):
            pub.publish(EVENT)
        pub.replay_mode = mode  # type: ignore[assignment]
        reader = Reader(KvRelay([source(pub)], replay_timeout_s=0.5).stream(2))
        await asyncio.wait_for(reader.task, 10)
        assert isinstance(reader.error, OutOfRange)
        assert reader.batches == []


async def test_expired_history_is_out_of_range() -> None:
    async with ScriptedPublisher() as pub:
        for _ in range(10):
            pub.publish(EVENT)
        pub.forget_before(8)
        reader = Reader(KvRelay([source(pub)]).stream(5))
        await asyncio.wait_for(reader.task, 10)
        assert isinstance(reader.error, OutOfRange)
        assert "starts at 8" in str(reader.error)


async def test_no_replay_endpoint_cannot_resume() -> None:
    async with ScriptedPublisher(replay=False) as pub:
        reader = Reader(KvRelay([source(pub)]).stream(3))
        await asyncio.wait_for(reader.task, 10)
        assert isinstance(reader.error, OutOfRange)


async def test_publisher_restart_is_data_loss() -> None:
    async with ScriptedPublisher() as pub:
        pub.next_seq = 100
        reader = Reader(KvRelay([source(pub)]).stream(0))
        await joined(pub, reader)
        pub.restart()
        pub.publish(EVENT)  # seq 1 after ~100
        await asyncio.wait_for(reader.task, 10)
        assert isinstance(reader.error, DataLoss)
        assert "restart" in str(reader.error)


async def test_several_ranks_keep_their_own_sequences() -> None:
    async with ScriptedPublisher(rank=0) as p0, ScriptedPublisher(rank=1) as p1:
        relay = KvRelay([source(p0, 0), source(p1, 1)])
        reader = Reader(relay.stream(0))
        await joined(p0, reader)
        p1.next_seq = 500
        for _ in range(200):
            p1.publish(EVENT)
            await asyncio.sleep(0.02)
            if any(b.dp_rank == 1 for b in reader.batches):
                break
        for _ in range(5):
            p0.publish(EVENT)
            p1.publish(EVENT)
        await reader.until(lambda r: sum(b.dp_rank == 1 for b in r.batches) >= 6)
        for rank in (0, 1):
            seqs = [b.sequence_number for b in reader.batches if b.dp_rank == rank]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (rank, seqs)
        await reader.close()


async def test_one_cursor_cannot_resume_several_ranks() -> None:
    async with ScriptedPublisher() as p0, ScriptedPublisher() as p1:
        with pytest.raises(OutOfRange, match="cannot resume 2 DP ranks"):
            async for _ in KvRelay([source(p0, 0), source(p1, 1)]).stream(7):
                pass


async def test_no_source_is_unimplemented() -> None:
    with pytest.raises(Unsupported):
        async for _ in KvRelay([]).stream(0):
            pass


async def test_undecodable_payload_is_an_empty_batch_not_a_gap() -> None:
    async with ScriptedPublisher() as pub:
        reader = Reader(KvRelay([source(pub)]).stream(0))
        await joined(pub, reader)
        bad = pub.publish(payload=b"\xc1\xc1 not msgpack")
        good = pub.publish(EVENT)
        await reader.until(lambda r: r.seqs[-1] >= good)
        batches = {b.sequence_number: b for b in reader.batches}
        assert list(batches[bad].events) == [] and len(batches[good].events) == 1
        assert pub.replay_requests == []
        await reader.close()


async def test_cancellation_mid_stream_closes_sockets_and_loses_nothing_before() -> None:
    async with ScriptedPublisher() as pub:
        relay = KvRelay([source(pub)])
        reader = Reader(relay.stream(0))
        await joined(pub, reader)
        sent = [pub.publish(EVENT) for _ in range(50)]
        await reader.until(lambda r: r.seqs[-1] >= sent[-1])
        await reader.close()  # cancel while polling
        assert reader.seqs == list(range(reader.seqs[0], sent[-1] + 1))
        assert reader.error is None
        # A new subscription on the same publisher works: the old sockets are gone.
        again = Reader(KvRelay([source(pub)]).stream(0))
        await joined(pub, again)
        await again.close()


async def test_load_records_and_heartbeats() -> None:
    calls: list[int] = []

    def load(rank: int) -> pb.EngineLoad:
        calls.append(rank)
        return pb.EngineLoad(running_requests=3, waiting_requests=1)

    async with ScriptedPublisher() as pub:
        reader = Reader(KvRelay([source(pub)], load_source=load, heartbeat_s=0.2).stream(0))
        await joined(pub, reader)
        last = reader.seqs[-1]
        await reader.until(lambda r: any(b.load.load_only for b in r.batches))
        first = reader.batches[0]
        assert first.load.running_requests == 3 and not first.load.load_only
        heartbeat = next(b for b in reader.batches if b.load.load_only)
        assert heartbeat.sequence_number == last and list(heartbeat.events) == []
        samples = [b.load.sample for b in reader.batches]
        assert samples == sorted(samples) and len(set(samples)) == len(samples)
        await reader.close()


async def test_a_subscriber_that_asks_gets_each_ranks_load_before_any_batch() -> None:
    """``load_records_before_first_batch`` (smg 1.13): a ``load_only`` batch per rank, numbered
    0, from the subscription on, while the publishers are silent; without it, nothing until the
    first batch. Ranks without a record (no stats yet) send none."""

    def load(rank: int) -> pb.EngineLoad | None:
        return pb.EngineLoad(running_requests=rank + 1) if rank < 2 else None

    async with ScriptedPublisher() as pub0, ScriptedPublisher() as pub1:
        pubs = [pub0, pub1, pub1]
        sources = [source(pub, rank) for rank, pub in enumerate(pubs)]
        asked = Reader(
            KvRelay(sources, load_source=load, heartbeat_s=0.2, loads_before_first=True).stream(0)
        )
        plain = Reader(KvRelay(sources, load_source=load, heartbeat_s=0.2).stream(0))
        await asked.until(lambda r: len(r.batches) >= 4, limit_s=5)
        first = [(b.dp_rank, b.sequence_number, b.load.load_only) for b in asked.batches[:2]]
        assert first == [(0, 0, True), (1, 0, True)]  # at once, before a heartbeat period
        assert [b.load.running_requests for b in asked.batches[:4]] == [1, 2, 1, 2]
        assert all(not b.events for b in asked.batches)
        assert plain.batches == []
        await joined(pub1, asked)  # rank 1 (and 2, same socket here) publish; rank 0 stays idle
        seq = max(b.sequence_number for b in asked.batches if not b.load.load_only)
        count = len(asked.batches)
        await asked.until(lambda r: len(r.batches) >= count + 2)
        beats = {(b.dp_rank, b.sequence_number) for b in asked.batches[count:] if b.load.load_only}
        assert (0, 0) in beats and (1, seq) in beats
        await asked.close()
        await plain.close()


async def test_subscribe_answers_once_accepted_and_refuses_before() -> None:
    from smg_servicer_kv_bridge import relay

    answered: list[str] = []

    async def ready() -> None:
        answered.append("headers")

    async with ScriptedPublisher() as pub:
        two = [source(pub, 0), source(pub, 1)]
        with pytest.raises(OutOfRange):
            await anext(relay.subscribe(two, 5, "off", ready=ready))
        with pytest.raises(Unsupported, match="off"):
            await anext(relay.subscribe(None, 0, "off", ready=ready))
        assert answered == []
        stream = relay.subscribe(two, 0, "off", lambda rank: pb.EngineLoad(), ready=ready,
                                 loads_before_first=True)  # fmt: skip
        batch = await asyncio.wait_for(anext(stream), 5)
        assert answered == ["headers"] and batch.load.load_only
        await stream.aclose()  # pyright: ignore[reportAttributeAccessIssue]


async def test_sglang_reply_form_resumes_too() -> None:
    async with ScriptedPublisher(style="sglang") as pub:
        for _ in range(6):
            pub.publish(EVENT)
        reader = Reader(KvRelay([source(pub)]).stream(4))
        await reader.until(lambda r: len(r.seqs) >= 2)
        assert reader.seqs == [5, 6]
        await reader.close()


async def test_metrics_count_batches_events_drops_replays_and_resets() -> None:
    from smg_servicer_core.metrics import ServicerMetrics

    metrics = ServicerMetrics()
    async with ScriptedPublisher() as pub:
        reader = Reader(KvRelay([source(pub)], metrics=metrics).stream(0))
        await joined(pub, reader)
        assert (metrics.kv_open, metrics.kv_subscriptions) == (1, 1)
        pub.publish([*EVENT, {"type": "NotAnEvent"}])  # one kept, one dropped
        base = pub.next_seq - 1
        pub.history.append((base + 1, pub.history[-1][1]))  # never reaches the SUB
        pub.next_seq = base + 2
        pub.publish(EVENT)  # a gap of one: repaired by replay
        await reader.until(lambda r: r.seqs and r.seqs[-1] >= base + 2)
        await reader.close()
    events = sum(len(b.events) for b in reader.batches if not b.load.load_only)
    assert metrics.kv_batches == len(reader.seqs)
    assert metrics.kv_events == events
    assert metrics.kv_dropped == {"unknown_type": 2}  # live, and the replayed batch with its body
    assert metrics.kv_replays == 1
    assert metrics.kv_open == 0
    async with ScriptedPublisher() as pub:
        pub.publish(EVENT)
        pub.replay_mode = "empty"
        failing = Reader(KvRelay([source(pub)], metrics=metrics, replay_timeout_s=0.5).stream(1))
        await asyncio.wait_for(failing.task, 10)
    assert isinstance(failing.error, OutOfRange)
    assert metrics.kv_resets == {"out_of_range": 1}
    assert (metrics.kv_open, metrics.kv_subscriptions) == (0, 2)

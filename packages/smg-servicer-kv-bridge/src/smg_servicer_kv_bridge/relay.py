# pyzmq's socket methods are only partly typed.
# pyright: reportUnknownMemberType=false
"""One relay per ``SubscribeKvEvents`` call: engine PUB sockets -> ``KvEventBatch`` stream.

Semantics (the seed README's "KV-event recovery"):

- ``start_sequence_number == 0``: relay live batches from now on, every DP rank, each batch
  carrying its rank and the publisher's own sequence number.
- ``start_sequence_number == N > 0`` (the router reconnecting after a gap it saw): subscribe live
  first, then ask the rank's replay endpoint for history from ``N``. The first replayed batch must
  be ``N`` itself (proof that history still reaches the cursor; it is not re-sent) and replies must
  be contiguous. Batches after ``N`` are forwarded, then live batches resume; the overlap between
  replay and live (queued on the SUB socket meanwhile) is dropped by sequence number.
- A live gap (``seq > cursor + 1``) is repaired the same way, from ``cursor + 1``.
- ``seq < cursor`` outside the replayed overlap means the publisher restarted.
- Failure -- no replay endpoint, replay missing / expired / empty / malformed / not answered within
  ``replay_timeout_s`` (5 s), a publisher restart -- ends the stream with OUT_OF_RANGE if no batch
  was sent yet, DATA_LOSS after. The router then drops what it knew of this worker and
  resubscribes with 0. An empty replay counts as a failure: it cannot tell an idle publisher from a
  restarted one.
- One cursor cannot resume several ranks (their sequences are independent): a non-zero cursor
  with more than one rank is OUT_OF_RANGE.
- A payload that does not decode is forwarded as an empty batch with its sequence number, so the
  router sees no false gap.
- Heartbeats: a ``load_only`` batch repeating the last sent sequence after ``heartbeat_s`` without
  a batch, carrying the engine's load record. A subscriber that sets
  ``load_records_before_first_batch`` (smg 1.13) gets them from the subscription on, one per rank,
  numbered 0 for a rank that has published nothing yet, so an idle engine's load reaches it; it
  gets its response headers at once as well (smg 1.13 gives a subscription 2 s to answer, then
  vetoes the worker as unreachable). Other subscribers get their first record with the first
  batch, as before.

Invariants: sockets are polled before every receive (cancelling a ``zmq.asyncio`` receive can drop
a message; cancelling a poll cannot), every socket is closed on exit, and memory is bounded (the SUB
queue by its high-water mark; replay by ``max_replay`` batches).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from smg_servicer_core.errors import DataLoss, OutOfRange, Unsupported
from smg_servicer_core.metrics import ServicerMetrics
from smg_servicer_core.proto import common_pb2 as pb
from smg_servicer_kv_bridge.normalize import Normalizer
from smg_servicer_kv_bridge.wire import (
    END_SEQ,
    Batch,
    MalformedFrame,
    decode_live,
    decode_payload,
    decode_replay,
    seq_bytes,
)

logger = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 5.0
MAX_REPLAY = 100_000
POLL_S = 0.1
HEARTBEAT_S = 1.0
#: Messages read per wake-up before the loop yields to other work.
DRAIN_MAX = 256

LoadSource = Callable[[int], pb.EngineLoad | None]


@dataclass(frozen=True)
class KvSource:
    """One DP rank's publisher."""

    rank: int
    endpoint: str
    replay_endpoint: str | None = None
    topic: bytes = b""
    hwm: int = 100_000


class RelayFailure(Exception):
    """History cannot be recovered; the subscriber must start over."""


@dataclass
class _Rank:
    source: KvSource
    socket: zmq.asyncio.Socket
    #: A synchronous view of the same socket, for non-blocking bulk reads after a poll.
    raw: zmq.Socket[bytes]
    cursor: int | None = None
    overlap_floor: int | None = None  # replayed range [floor, cursor] may repeat on live
    last_sent_seq: int = 0


@dataclass
class RelayStats:
    batches: int = 0
    duplicates: int = 0
    replayed: int = 0
    undecodable: int = 0
    malformed_frames: int = 0
    heartbeats: int = 0
    dropped_events: dict[str, int] = field(default_factory=dict[str, int])


class KvRelay:
    def __init__(
        self,
        sources: Sequence[KvSource],
        *,
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        max_replay: int = MAX_REPLAY,
        load_source: LoadSource | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        metrics: ServicerMetrics | None = None,
        loads_before_first: bool = False,
    ) -> None:
        self.sources = list(sources)
        self.loads_before_first = loads_before_first
        self.context = context or zmq.asyncio.Context.instance()
        self.replay_timeout_s = replay_timeout_s
        self.max_replay = max_replay
        self.load_source = load_source
        self.heartbeat_s = heartbeat_s
        self.metrics = metrics
        self.normalizer = Normalizer(on_drop=metrics.kv_drop if metrics is not None else None)
        self.stats = RelayStats()
        self._started = False
        self._load_sample = 0

    async def stream(self, start_seq: int = 0) -> AsyncIterator[pb.KvEventBatch]:
        metrics = self.metrics
        if metrics is not None:
            metrics.kv_opened()
        try:
            async for batch in self._stream(start_seq):
                yield batch
        except (OutOfRange, DataLoss) as reset:
            if metrics is not None:
                metrics.kv_reset("out_of_range" if isinstance(reset, OutOfRange) else "data_loss")
            raise
        finally:
            if metrics is not None:
                metrics.kv_closed()

    def refuse(self, start_seq: int) -> None:
        """Raise the status a subscription from ``start_seq`` ends with before any batch."""
        if not self.sources:
            raise Unsupported("no KV-event publisher is configured on this engine")
        if start_seq and len(self.sources) > 1:
            raise OutOfRange(
                f"one cursor cannot resume {len(self.sources)} DP ranks (their sequences are "
                "independent); resubscribe with 0"
            )

    async def _stream(self, start_seq: int) -> AsyncIterator[pb.KvEventBatch]:
        self.refuse(start_seq)
        ranks = [self._subscribe(source) for source in self.sources]
        poller = zmq.asyncio.Poller()
        for rank in ranks:
            poller.register(rank.socket, zmq.POLLIN)
        try:
            if start_seq:
                await asyncio.sleep(0.05)  # let the SUB join before history is requested
                async for batch in self._resume(ranks[0], start_seq, first_is_known=True):
                    yield batch
            async for batch in self._live(ranks, poller):
                yield batch
        except RelayFailure as failure:
            logger.warning("KV-event stream reset: %s", failure)
            if self._started:
                raise DataLoss(f"KV-event history lost: {failure}; resubscribe with 0") from None
            raise OutOfRange(f"cannot resume from {start_seq}: {failure}") from None
        finally:
            for rank in ranks:
                rank.socket.close(linger=0)
            self.stats.dropped_events = dict(self.normalizer.dropped)
            logger.info("KV-event relay closed: %s", self.stats)

    def _subscribe(self, source: KvSource) -> _Rank:
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.RCVHWM, source.hwm)
        socket.setsockopt(zmq.SUBSCRIBE, source.topic)
        socket.connect(source.endpoint)
        raw: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)  # pyright: ignore[reportUnknownVariableType]
        return _Rank(source=source, socket=socket, raw=raw)

    async def _live(
        self, ranks: list[_Rank], poller: zmq.asyncio.Poller
    ) -> AsyncIterator[pb.KvEventBatch]:
        by_socket = {id(rank.socket): rank for rank in ranks}
        last_activity = time.monotonic() - (self.heartbeat_s if self.loads_before_first else 0)
        while True:
            due = time.monotonic() - last_activity >= self.heartbeat_s
            if due and (self._started or self.loads_before_first):
                heartbeats = self._heartbeats(ranks)
                if heartbeats:
                    last_activity = time.monotonic()
                for heartbeat in heartbeats:
                    yield heartbeat
            ready = await poller.poll(timeout=int(POLL_S * 1000))
            if not ready:
                continue
            for socket, _ in ready:
                rank = by_socket[id(socket)]
                for frames in self._drain(rank.raw):
                    try:
                        batch = decode_live(frames)
                    except MalformedFrame:
                        self.stats.malformed_frames += 1
                        continue
                    last_activity = time.monotonic()
                    if rank.cursor is None or batch.seq == rank.cursor + 1:  # the common case
                        rank.cursor = batch.seq
                        yield self._to_proto(rank, batch)
                        continue
                    async for message in self._accept(rank, batch):
                        yield message

    @staticmethod
    def _drain(raw: zmq.Socket[bytes]) -> list[list[bytes]]:
        """Every message already queued (up to DRAIN_MAX), read without waiting: one poll
        wake-up serves a burst instead of one message."""
        messages: list[list[bytes]] = []
        while len(messages) < DRAIN_MAX:
            try:
                messages.append(raw.recv_multipart(flags=zmq.NOBLOCK))
            except zmq.Again:
                break
        return messages

    async def _accept(self, rank: _Rank, batch: Batch) -> AsyncIterator[pb.KvEventBatch]:
        cursor = rank.cursor
        if cursor is None or batch.seq == cursor + 1:
            rank.cursor = batch.seq
            yield self._to_proto(rank, batch)
            return
        if batch.seq <= cursor:
            floor = rank.overlap_floor if rank.overlap_floor is not None else cursor
            if batch.seq >= floor:
                self.stats.duplicates += 1
                return
            raise RelayFailure(
                f"rank {rank.source.rank} went back from {cursor} to {batch.seq} "
                "(publisher restart)"
            )
        # A gap: fetch cursor+1.. from history, then this batch unless history already had it.
        async for message in self._resume(rank, cursor + 1, first_is_known=False):
            yield message
        if rank.cursor is not None and batch.seq == rank.cursor + 1:
            rank.cursor = batch.seq
            yield self._to_proto(rank, batch)
        elif rank.cursor is not None and batch.seq > rank.cursor + 1:
            raise RelayFailure(f"replay for rank {rank.source.rank} ended before {batch.seq}")

    async def _resume(
        self, rank: _Rank, start: int, *, first_is_known: bool
    ) -> AsyncIterator[pb.KvEventBatch]:
        replies = await self._fetch(rank.source, start)
        if not replies:
            raise RelayFailure(f"empty replay from rank {rank.source.rank}")
        if replies[0][0] != start:
            raise RelayFailure(
                f"history of rank {rank.source.rank} starts at {replies[0][0]}, not {start}"
            )
        for (prev, _), (seq, _) in itertools.pairwise(replies):
            if seq != prev + 1:
                raise RelayFailure(f"replay of rank {rank.source.rank} jumps {prev} -> {seq}")
        rank.overlap_floor = start
        rank.cursor = replies[-1][0]
        self.stats.replayed += len(replies)
        if self.metrics is not None:
            self.metrics.kv_replay()
        for seq, payload in replies[1:] if first_is_known else replies:
            yield self._to_proto(rank, decode_payload(seq, payload))

    async def _fetch(self, source: KvSource, start: int) -> list[tuple[int, bytes]]:
        if not source.replay_endpoint:
            raise RelayFailure(f"rank {source.rank} has no replay endpoint")
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(source.replay_endpoint)
        replies: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self.replay_timeout_s
        try:
            await dealer.send_multipart([b"", seq_bytes(start)])
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await dealer.poll(timeout=int(remaining * 1000)):
                    raise RelayFailure(f"replay from rank {source.rank} timed out")
                frames = await dealer.recv_multipart(flags=zmq.NOBLOCK)
                try:
                    seq, payload = decode_replay(frames)
                except MalformedFrame as exc:
                    raise RelayFailure(f"malformed replay from rank {source.rank}: {exc}") from exc
                if seq == END_SEQ:
                    return replies
                replies.append((seq, payload))
                if len(replies) > self.max_replay:
                    raise RelayFailure(f"replay from rank {source.rank} exceeds {self.max_replay}")
        finally:
            dealer.close(linger=0)

    def _to_proto(self, rank: _Rank, batch: Batch) -> pb.KvEventBatch:
        self._started = True
        self.stats.batches += 1
        if batch.undecodable:
            self.stats.undecodable += 1
        rank.last_sent_seq = batch.seq
        message = pb.KvEventBatch(
            sequence_number=batch.seq,
            timestamp=batch.ts,
            events=self.normalizer.convert(batch.events),
            dp_rank=rank.source.rank,  # the socket's rank wins over the payload's
        )
        load = self._load(rank.source.rank)
        if load is not None:
            message.load.CopyFrom(load)
        if self.metrics is not None:
            self.metrics.kv_batch(len(message.events))
        return message

    def _load(self, rank: int) -> pb.EngineLoad | None:
        if self.load_source is None:
            return None
        try:
            load = self.load_source(rank)
        except Exception:
            logger.warning("load source failed for rank %d", rank, exc_info=True)
            return None
        if load is not None:
            self._load_sample += 1
            load.sample = self._load_sample
        return load

    def _heartbeats(self, ranks: list[_Rank]) -> list[pb.KvEventBatch]:
        """``load_only`` batches (no events) repeating the last sent sequence: one per rank for a
        subscriber that takes records before the first batch, else the latest rank's only."""
        if not self.loads_before_first:
            ranks = [max(ranks, key=lambda r: r.last_sent_seq)]
        heartbeats: list[pb.KvEventBatch] = []
        for rank in ranks:
            load = self._load(rank.source.rank)
            if load is None:
                continue
            load.load_only = True
            self.stats.heartbeats += 1
            heartbeats.append(
                pb.KvEventBatch(
                    sequence_number=rank.last_sent_seq, dp_rank=rank.source.rank, load=load
                )
            )
        return heartbeats


async def subscribe(
    sources: Sequence[KvSource] | None,
    start_seq: int,
    off_hint: str,
    load_source: LoadSource | None = None,
    metrics: ServicerMetrics | None = None,
    *,
    loads_before_first: bool = False,
    ready: Callable[[], Awaitable[object]] | None = None,
) -> AsyncIterator[pb.KvEventBatch]:
    """``SubscribeKvEvents`` for a servicer: UNIMPLEMENTED with ``off_hint`` when the engine
    publishes no ZMQ KV events (``sources`` None; the router falls back to GetLoads), else one
    relay over every rank from ``start_seq``, reporting to ``metrics`` when given.
    ``loads_before_first`` is the request's ``load_records_before_first_batch``; ``ready`` (the
    call's ``send_initial_metadata``) is awaited once the subscription is accepted, so the
    subscriber sees it answered before the first batch."""
    if sources is None:
        raise Unsupported(off_hint)
    relay = KvRelay(
        sources, load_source=load_source, metrics=metrics, loads_before_first=loads_before_first
    )
    relay.refuse(start_seq)
    logger.info("KV-event subscription opened (start=%d, ranks=%d)", start_seq, len(sources))
    if ready is not None:
        await ready()
    async for batch in relay.stream(start_seq):
        yield batch


def subscription(
    request: pb.SubscribeKvEventsRequest,
    context: Any,
    sources: Sequence[KvSource] | None,
    off_hint: str,
    *,
    load_source: LoadSource | None = None,
    metrics: ServicerMetrics | None = None,
) -> AsyncIterator[pb.KvEventBatch]:
    """:func:`subscribe` for one ``SubscribeKvEvents`` call: the request's cursor and
    ``load_records_before_first_batch``; the call (``context``) answered once accepted."""
    return subscribe(
        sources,
        request.start_sequence_number,
        off_hint,
        load_source,
        metrics,
        loads_before_first=request.load_records_before_first_batch,
        ready=lambda: context.send_initial_metadata(()),
    )

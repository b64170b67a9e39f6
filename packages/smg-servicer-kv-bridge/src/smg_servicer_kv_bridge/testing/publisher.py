# pyzmq's socket methods are only partly typed.
# pyright: reportUnknownMemberType=false
"""A publisher that speaks the engines' wire, with faults on demand.

    async with ScriptedPublisher(style="vllm") as pub:
        pub.publish([stored_event([11], [1, 2, 3, 4])])   # seq 1
        pub.replay_mode = "timeout"                        # or "empty", "malformed"
        pub.forget_before(5)                               # history expired below 5

Sequence numbers start at 1 and increase by one per :meth:`publish` unless given. History keeps
every published batch (bounded by ``buffer``) for the replay ROUTER, which answers in the vLLM
(``[b"", topic, seq, payload]``) or SGLang (``[b"", seq, payload]``) reply form.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # typing.Self is 3.11+; the annotations are never evaluated
    from typing import Self

import zmq
import zmq.asyncio

from smg_servicer_kv_bridge.wire import END_SEQ, encode_batch, seq_bytes

ReplayMode = Literal["normal", "timeout", "empty", "malformed"]


def stored_event(
    hashes: list[int], tokens: list[int], block_size: int | None = None, **extra: Any
) -> dict[str, Any]:
    size = block_size if block_size is not None else len(tokens) // max(len(hashes), 1)
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        **extra,
    }


class ScriptedPublisher:
    def __init__(
        self,
        *,
        style: Literal["vllm", "sglang"] = "vllm",
        topic: bytes = b"",
        rank: int = 0,
        replay: bool = True,
        buffer: int = 100_000,
    ) -> None:
        self.style = style
        self.topic = topic
        self.rank = rank
        self.context = zmq.asyncio.Context.instance()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay:
            self.router = self.context.socket(zmq.ROUTER)
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self.history: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.next_seq = 1
        self.replay_mode: ReplayMode = "normal"
        self.replay_requests: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        if self.router is not None:
            self._task = asyncio.create_task(self._serve_replay())
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop_replay()
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)

    def publish(
        self,
        events: list[Any] | None = None,
        *,
        seq: int | None = None,
        payload: bytes | None = None,
        record: bool = True,
    ) -> int:
        """Send one batch now (non-blocking); returns its sequence number."""
        number = self.next_seq if seq is None else seq
        self.next_seq = number + 1
        body = (
            payload if payload is not None else encode_batch(time.time(), events or [], self.rank)
        )
        if record:
            self.history.append((number, body))
        self.pub.send_multipart([self.topic, seq_bytes(number), body], flags=zmq.NOBLOCK)
        return number

    def forget_before(self, seq: int) -> None:
        """History below ``seq`` has expired."""
        while self.history and self.history[0][0] < seq:
            self.history.popleft()

    def restart(self) -> None:
        """The engine restarted: numbering starts over and history is gone."""
        self.history.clear()
        self.next_seq = 1

    async def kill_and_restart(self) -> None:
        """The engine process died and came back: both sockets closed, then bound again on the
        same endpoints, numbering from 1 with no history (subscribers reconnect by themselves)."""
        await self._stop_replay()
        self.pub.close(linger=0)
        self.pub = await self._rebind(zmq.PUB, self.endpoint)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        if self.router is not None and self.replay_endpoint is not None:
            self.router.close(linger=0)
            self.router = await self._rebind(zmq.ROUTER, self.replay_endpoint)
            self._task = asyncio.create_task(self._serve_replay())
        self.restart()

    async def _rebind(self, kind: int, endpoint: str) -> zmq.asyncio.Socket:
        """A new socket bound to ``endpoint``; ZMQ releases a closed socket's port in its I/O
        thread, so the bind is retried for up to 5 s."""
        for _ in range(100):
            sock = self.context.socket(kind)
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                if exc.errno != zmq.EADDRINUSE:
                    raise
                await asyncio.sleep(0.05)
                continue
            return sock
        raise RuntimeError(f"{endpoint} stayed in use")

    async def _stop_replay(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            self.replay_requests.append(start)
            if self.replay_mode == "timeout":
                continue
            if self.replay_mode == "malformed":
                await self.router.send_multipart([client, b"", b"garbage"])
                continue
            if self.replay_mode == "normal":
                for seq, body in list(self.history):
                    if seq >= start:
                        await self.router.send_multipart([client, *self._reply(seq, body)])
            await self.router.send_multipart([client, *self._reply(END_SEQ, b"")])

    def _reply(self, seq: int, body: bytes) -> list[bytes]:
        if self.style == "vllm":
            return [b"", self.topic, seq_bytes(seq), body]
        return [b"", seq_bytes(seq), body]

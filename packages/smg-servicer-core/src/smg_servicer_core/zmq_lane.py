"""What every launcher of ours for the router's direct ZMQ lane shares (engine-free; needs the
``zmq`` extra: pyzmq and msgspec).

The router (``smg`` 1.13) binds a tcp handshake socket for each ``ipc://`` worker and the engines
dial it: HELLO, the router's INIT (the data-plane addresses), READY. Nothing tells the router when
an engine process is killed, so our launchers put :class:`HandshakeRelay` between the two: it
forwards every handshake frame both ways, keeps the output addresses the INIT names, and can send
the dead-engine sentinel (:data:`ENGINE_CORE_DEAD`, the same frame on every engine protocol the
router speaks) there on a dead engine's behalf."""

from __future__ import annotations

import logging
import threading

import msgspec
import zmq

logger = logging.getLogger(__name__)

#: The dead-engine sentinel on an engine's output socket: one frame, which the router takes as
#: "this engine is gone" (vLLM's ``EngineCoreProc.ENGINE_CORE_DEAD``; SGLang's and TokenSpeed's
#: lanes reuse it).
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
#: How long the sentinel may wait for the router to take it.
SENTINEL_LINGER_MS = 1000
#: Frames the relay holds for a side that is not there yet (the router not started): a bound.
RELAY_HWM = 64

#: Where the router's handshake listens, for an ``ipc://`` worker URL: ``smg`` 1.13's
#: ``derive_handshake_port`` (FNV-1a of the path, folded into 20000-29999).
_PORT_BASE, _PORT_SPAN = 20000, 10000


def handshake_port(worker_url: str) -> int:
    """The router's tcp handshake port for the ``ipc://PATH`` worker URL it was given."""
    path = worker_url.removeprefix("ipc://")
    h = 0xCBF29CE484222325
    for byte in path.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return _PORT_BASE + h % _PORT_SPAN


def handshake_address(address: str | None, worker_url: str | None) -> str:
    """The router's handshake from ``--zmq-handshake-address`` or ``--zmq-worker-url``;
    ``ValueError`` (a configuration error) for anything else."""
    if worker_url is not None:
        if not worker_url.startswith("ipc://"):
            raise ValueError(f"--zmq-worker-url must be ipc://PATH, got {worker_url!r}")
        address = f"tcp://127.0.0.1:{handshake_port(worker_url)}"
    if address is None:
        raise ValueError("name the router's handshake: --zmq-handshake-address tcp://HOST:PORT")
    if not address.startswith("tcp://"):
        raise ValueError(f"--zmq-handshake-address must be tcp://HOST:PORT, got {address!r}")
    return address


class HandshakeRelay:
    """Forwards the startup handshake (HELLO -> INIT -> READY) between the engine processes and
    the router, frame for frame, and keeps the output addresses the router's INIT names.

    The engines dial :attr:`address` (a ROUTER here); for each engine identity the relay dials
    the router with a DEALER of the same identity, so the router sees the engines themselves. One
    thread; every socket bounded (:data:`RELAY_HWM`)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._ctx = zmq.Context()
        self._front = self._ctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.RCVHWM, RELAY_HWM)
        self._front.setsockopt(zmq.SNDHWM, RELAY_HWM)
        port = self._front.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._backs: dict[bytes, zmq.Socket[bytes]] = {}
        self._outputs: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smg-handshake-relay", daemon=True)
        self._thread.start()

    def outputs(self) -> list[str]:
        """The router's output addresses, once an engine's INIT has passed (else empty)."""
        with self._lock:
            return list(self._outputs)

    def _back(self, identity: bytes, poller: zmq.Poller) -> zmq.Socket[bytes]:
        sock = self._backs.get(identity)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.SNDHWM, RELAY_HWM)
            sock.setsockopt(zmq.RCVHWM, RELAY_HWM)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.upstream)
            poller.register(sock, zmq.POLLIN)
            self._backs[identity] = sock
        return sock

    def _learn(self, frame: bytes) -> None:
        try:
            init = msgspec.msgpack.decode(frame)
            found = [str(a) for a in init["addresses"]["outputs"]]
        except (msgspec.DecodeError, KeyError, TypeError):
            return  # not an INIT (or not one we read): forwarded all the same
        with self._lock:
            self._outputs.extend(a for a in found if a not in self._outputs)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(200):
                if sock is self._front:
                    identity, *frames = self._front.recv_multipart()
                    self._back(identity, poller).send_multipart(frames)
                else:
                    frames = sock.recv_multipart()
                    self._learn(frames[0])
                    self._front.send_multipart([sock.getsockopt(zmq.IDENTITY), *frames])

    def send_dead(self) -> list[str]:
        """:data:`ENGINE_CORE_DEAD` to each output address the router named (what was told)."""
        told = self.outputs()
        for address in told:
            push = self._ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, SENTINEL_LINGER_MS)
            push.connect(address)
            push.send(ENGINE_CORE_DEAD)
            push.close()
        return told

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for sock in (self._front, *self._backs.values()):
            sock.close(linger=0)
        self._ctx.term()

"""In-flight requests of one servicer, so every request is stopped in the engine exactly once.

A ``Generate`` call tracks its request for as long as it runs::

    async with registry.track(request_id) as handle:
        async for output in engine.generate(...):
            ...
            if handle.aborted:
                break

Three things can stop a request early: an ``Abort`` RPC (:meth:`RequestRegistry.abort`), the
client cancelling the call, or an error while streaming. Each of them ends in the same place,
:meth:`RequestHandle.stop`, which calls the engine's abort at most once. A request that finished
normally is never aborted in the engine. Aborting twice is harmless. ``Abort`` for an id that is
not in flight stops nothing, but the id is remembered for :data:`EARLY_ABORT_MEMORY_S`: the router
sends ``Abort`` on its own stream, which can overtake the ``Generate`` it is about, and that
``Generate`` is then refused with ABORTED on arrival instead of running to its end for nobody (the
reliability suite's cancel storm found such requests). Each engine abort is reported once to
``on_stop`` with its cause (``abort_rpc``, ``client_cancel``, ``error``, or ``shutdown`` when the
server is draining), which is what the metrics count.

Invariants:
- ``len(registry)`` (``active_requests``) counts exactly the requests inside ``track``;
- the engine abort callback runs at most once per tracked request, and never after a normal finish;
- a request id can be tracked once at a time (a second ``track`` raises :class:`AlreadyExists`),
  and is at most :data:`MAX_REQUEST_ID_CHARS` long (INVALID_ARGUMENT);
- at most :data:`EARLY_ABORT_MEMORY` early aborts are remembered, each for
  :data:`EARLY_ABORT_MEMORY_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager

from smg_servicer_core.errors import Aborted, AlreadyExists, InvalidRequest

logger = logging.getLogger(__name__)

#: The longest request id taken (the router's are a few dozen characters); a longer one is the
#: client's fault, refused before it reaches a log line or the engine.
MAX_REQUEST_ID_CHARS = 1024
#: How long an ``Abort`` for an id not in flight is remembered (the race it covers is
#: milliseconds; a queue of calls not yet dispatched can stretch it to seconds).
EARLY_ABORT_MEMORY_S = 10.0
#: The most early aborts remembered at once (the oldest is forgotten first).
EARLY_ABORT_MEMORY = 4096

#: The clock early aborts expire by (a module attribute, so a test can move it).
clock: Callable[[], float] = time.monotonic

EngineAbort = Callable[[str], Awaitable[None]]
StopHook = Callable[[str], None]


class RequestHandle:
    """One tracked request. ``aborted`` becomes true when it was stopped from outside."""

    __slots__ = (
        "_done",
        "_engine_abort",
        "_on_stop",
        "_stopped",
        "abort_reason",
        "request_id",
        "stopped",
    )

    def __init__(
        self, request_id: str, engine_abort: EngineAbort, on_stop: StopHook | None = None
    ) -> None:
        self.request_id = request_id
        self.abort_reason: str | None = None
        self._engine_abort = engine_abort
        self._on_stop = on_stop
        self._done = False
        self._stopped = False
        #: Set when the request was stopped early (abort RPC, cancel, error).
        self.stopped = asyncio.Event()

    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def mark_finished(self) -> None:
        """The request ended normally: it must never be aborted in the engine afterwards."""
        self._done = not self._stopped

    async def stop(self, reason: str, cause: str = "abort_rpc") -> bool:
        """Stop the engine request once. True if this call issued the engine abort."""
        if self._done or self._stopped:
            return False
        self._stopped = True
        self.abort_reason = reason
        self.stopped.set()
        if self._on_stop is not None:
            self._on_stop(cause)
        try:
            await self._engine_abort(self.request_id)
        except Exception:
            logger.exception("engine abort failed for request %s", self.request_id)
        return True


class RequestRegistry:
    """The servicer's in-flight requests; ``engine_abort`` stops one in the engine."""

    def __init__(
        self,
        engine_abort: EngineAbort,
        *,
        on_stop: StopHook | None = None,
        shutting_down: Callable[[], bool] | None = None,
    ) -> None:
        self._engine_abort = engine_abort
        self._active: dict[str, RequestHandle] = {}
        #: Called with the cause of every engine abort (metrics); may be set later.
        self.on_stop = on_stop
        self._shutting_down = shutting_down or (lambda: False)
        #: Aborted ids that were not in flight -> when that abort expires (monotonic).
        self._early: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._active)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._active

    def get(self, request_id: str) -> RequestHandle | None:
        return self._active.get(request_id)

    @asynccontextmanager
    async def track(self, request_id: str) -> AsyncGenerator[RequestHandle]:
        if not request_id:
            raise InvalidRequest("request_id must not be empty")
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequest(
                f"request_id has {len(request_id)} characters; at most {MAX_REQUEST_ID_CHARS}"
            )
        if request_id in self._active:
            raise AlreadyExists(f"request {request_id} is already in flight")
        if self._early and self._take_early(request_id):
            raise Aborted(f"request {request_id} was aborted before it arrived")
        handle = RequestHandle(request_id, self._engine_abort, self.on_stop)
        self._active[request_id] = handle
        try:
            yield handle
            handle.mark_finished()
        except (asyncio.CancelledError, GeneratorExit):
            draining = self._shutting_down()
            reason = "server shutting down" if draining else "client cancelled"
            await asyncio.shield(handle.stop(reason, "shutdown" if draining else "client_cancel"))
            raise
        except BaseException:
            await asyncio.shield(handle.stop("error", "error"))
            raise
        finally:
            self._active.pop(request_id, None)

    async def abort(self, request_id: str, reason: str = "aborted by request") -> bool:
        """Stop ``request_id`` if it is in flight. True if this call issued the engine abort."""
        handle = self._active.get(request_id)
        if handle is None:
            if request_id:
                self._remember_early(request_id)
            return False
        return await handle.stop(reason)

    def _remember_early(self, request_id: str) -> None:
        now = clock()
        early = self._early
        early[request_id] = now + EARLY_ABORT_MEMORY_S
        early.move_to_end(request_id)
        while early and (len(early) > EARLY_ABORT_MEMORY or next(iter(early.values())) < now):
            early.popitem(last=False)

    def _take_early(self, request_id: str) -> bool:
        expires = self._early.pop(request_id, None)
        return expires is not None and expires >= clock()

    async def abort_many(self, request_ids: list[str], reason: str = "aborted by request") -> int:
        issued = 0
        for request_id in request_ids:
            issued += await self.abort(request_id, reason)
        return issued

    async def abort_all(self, reason: str) -> int:
        """Stop every request in flight (cause ``shutdown``)."""
        issued = 0
        for handle in list(self._active.values()):
            issued += await handle.stop(reason, "shutdown")
        return issued

"""The one health state of a servicer: ``grpc.health.v1`` ``Check``/``Watch`` and the engine's own
``HealthCheck`` RPC all read it.

Rules (the same for every engine)::

    NOT_SERVING  before the engine is ready              (set_serving() not called yet)
    SERVING      once ready, while the engine probe passes
    NOT_SERVING  while the probe fails or times out      (SERVING again when it recovers)
    NOT_SERVING  for good once shutdown starts            (enter_shutdown(); set_serving ignored)

The engine probe is injected (``HealthFrame(service, probe=...)`` or the ``probe`` attribute): an
async callable returning None when the engine is healthy, else a short reason. ``Check`` runs it
on every call for a SERVING service; ``Watch`` re-evaluates on every state change and at least
every ``watch_interval_s`` (1 s), so a watcher sees a failing engine without asking again. The
probe is bounded by ``probe_timeout_s``; an exception in it counts as a failure (logged once per
outage, never sent to the client).

Answers for ``""`` (the process) and the engine's full service name. Unknown service names get
NOT_FOUND from ``Check`` (the gRPC health spec) and SERVICE_UNKNOWN from ``Watch``. The router
does not use this service; it calls the engine's own ``HealthCheck`` (:mod:`.servicer`), which
reports :meth:`HealthFrame.reason`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

logger = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

#: An engine probe: None when healthy, else a short client-safe reason.
Probe = Callable[[], Awaitable[str | None]]

PROBE_TIMEOUT_S = 5.0
WATCH_INTERVAL_S = 1.0
SHUTTING_DOWN = "shutting down"
STARTING = "starting"


class HealthFrame(health_pb2_grpc.HealthServicer):
    """The process's health for ``""`` and one engine service, driven by an engine probe."""

    def __init__(
        self,
        engine_service: str,
        probe: Probe | None = None,
        *,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        watch_interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.engine_service = engine_service
        self.probe = probe
        self.probe_timeout_s = probe_timeout_s
        self.watch_interval_s = watch_interval_s
        self._ready = False
        self._shutting_down = False
        self._outage: str | None = None
        self._changed = asyncio.Event()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    @property
    def ready(self) -> bool:
        return self._ready and not self._shutting_down

    def _notify(self) -> None:
        # Wake every watcher, then arm the event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def set_serving(self) -> None:
        """The engine is ready (ignored once shutdown started)."""
        if not self._shutting_down and not self._ready:
            self._ready = True
            self._notify()

    def enter_shutdown(self) -> None:
        """NOT_SERVING for good, from now on."""
        if not self._shutting_down:
            self._shutting_down = True
            self._notify()

    async def _probe(self) -> str | None:
        if self.probe is None:
            return None
        try:
            reason = await asyncio.wait_for(self.probe(), self.probe_timeout_s)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before 3.11
            reason = f"engine health probe timed out after {self.probe_timeout_s:g}s"
        except Exception as exc:
            reason = "engine health probe failed"
            if self._outage is None:
                logger.warning("engine health probe raised %s", type(exc).__name__, exc_info=True)
        if reason != self._outage:
            if reason is not None:
                logger.warning("engine unhealthy: %s", reason)
            elif self._outage is not None:
                logger.info("engine healthy again")
            self._outage = reason
        return reason

    async def reason(self) -> str | None:
        """None while SERVING; else why not (shutting down, the probe's reason, starting)."""
        if self._shutting_down:
            return SHUTTING_DOWN
        probed = await self._probe()
        if probed is not None:
            return probed
        if self._shutting_down:  # shutdown began while the probe ran
            return SHUTTING_DOWN
        return None if self._ready else STARTING

    async def status(self, service: str = "") -> int | None:
        """The ``grpc.health.v1`` status of ``service`` (None: unknown service)."""
        if service not in ("", self.engine_service):
            return None
        if not self.ready:
            return NOT_SERVING
        return SERVING if await self.reason() is None else NOT_SERVING

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> health_pb2.HealthCheckResponse:
        status = await self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = None
        while True:
            changed = self._changed
            status = await self.status(request.service)
            status = SERVICE_UNKNOWN if status is None else status
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), self.watch_interval_s)

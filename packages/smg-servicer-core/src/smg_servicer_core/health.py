"""``grpc.health.v1.Health`` for Kubernetes-style probes.

Answers for ``""`` (the process) and the engine's full service name (readiness). Both start
NOT_SERVING; :meth:`HealthFrame.set_serving` flips them once the engine is ready, and
:meth:`HealthFrame.enter_shutdown` sets NOT_SERVING for good: later ``set_serving`` calls are
ignored, so a late readiness signal cannot undo a shutdown.

Unknown service names get NOT_FOUND from ``Check`` (the gRPC health spec) and SERVICE_UNKNOWN from
``Watch``. The router does not use this service; it calls the engine's own ``HealthCheck``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class HealthFrame(health_pb2_grpc.HealthServicer):
    """The process's ``grpc.health.v1`` state for ``""`` and one engine service."""

    def __init__(self, engine_service: str) -> None:
        self.engine_service = engine_service
        self._status = {"": NOT_SERVING, engine_service: NOT_SERVING}
        self._shutting_down = False
        self._changed = asyncio.Event()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def status(self, service: str = "") -> int | None:
        return self._status.get(service)

    def _set_all(self, status: int) -> None:
        for service in self._status:
            self._status[service] = status
        # Wake every watcher, then arm the event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def set_serving(self) -> None:
        if not self._shutting_down:
            self._set_all(SERVING)

    def set_not_serving(self) -> None:
        self._set_all(NOT_SERVING)

    def set_engine_serving(self, serving: bool) -> None:
        """Readiness of the engine service alone (liveness ``""`` unchanged), for engines that
        can be alive but stuck. Ignored while not serving overall or shutting down."""
        if self._shutting_down or self._status[""] != SERVING:
            return
        status = SERVING if serving else NOT_SERVING
        if self._status[self.engine_service] != status:
            self._status[self.engine_service] = status
            self._changed.set()
            self._changed = asyncio.Event()

    def enter_shutdown(self) -> None:
        self._shutting_down = True
        self._set_all(NOT_SERVING)

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
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
            status = self._status.get(request.service, SERVICE_UNKNOWN)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await self._changed.wait()

"""``VllmHealthServicer(async_llm)``: the ``grpc.health.v1`` servicer vLLM's launcher registers.

SERVING for ``""`` and ``vllm.grpc.engine.VllmEngine`` while ``await async_llm.check_health()``
succeeds; NOT_SERVING when it raises (logged once per outage) and, for good, after
``set_not_serving()`` (the launcher calls it when shutdown starts). ``set_not_serving`` is a plain
method because the launcher calls it synchronously.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc.aio
from grpc_health.v1 import health_pb2

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import vllm_engine_pb2 as pb

logger = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name


class VllmHealthServicer(HealthFrame):
    def __init__(self, async_llm: Any) -> None:
        super().__init__(SERVICE_NAME)
        self.async_llm = async_llm
        self._outage_logged = False
        self.set_serving()

    def set_not_serving(self) -> None:
        self.enter_shutdown()

    async def _engine_healthy(self) -> bool:
        try:
            await self.async_llm.check_health()
        except Exception as exc:
            if not self._outage_logged:
                logger.warning("engine health check failed: %s", type(exc).__name__)
                self._outage_logged = True
            return False
        self._outage_logged = False
        return True

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        response = await super().Check(request, context)
        if response.status == health_pb2.HealthCheckResponse.SERVING and not (
            await self._engine_healthy()
        ):
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return response

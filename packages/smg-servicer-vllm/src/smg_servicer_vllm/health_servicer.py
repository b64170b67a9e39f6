"""``VllmHealthServicer(async_llm)``: the ``grpc.health.v1`` servicer vLLM's launcher registers.

vLLM's launcher builds it and :class:`~smg_servicer_vllm.servicer.VllmEngineServicer` separately
from the same ``AsyncLLM``; both read one :class:`~smg_servicer_core.health.HealthFrame` per engine
(:func:`health_for`), so ``grpc.health.v1`` ``Check``/``Watch`` and the engine's ``HealthCheck``
always agree: SERVING while ``await async_llm.check_health()`` passes, NOT_SERVING while it fails
(SERVING again when it recovers) and, for good, from ``set_not_serving()`` on (the launcher calls
it when shutdown starts, synchronously). In vLLM's launcher process ``set_not_serving()`` also
arms the stop deadline (:func:`smg_servicer_vllm.plugin.shutdown_deadline`).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_servicer_core.health import HealthFrame, Probe
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm import plugin

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
ENGINE_DEAD = "Engine is not alive"

_FRAMES: weakref.WeakKeyDictionary[Any, HealthFrame] = weakref.WeakKeyDictionary()


def _probe_for(async_llm: Any) -> Probe:
    async def probe() -> str | None:
        if getattr(async_llm, "errored", False):
            return ENGINE_DEAD
        try:
            await async_llm.check_health()
        except Exception:
            return ENGINE_DEAD
        return None

    return probe


def health_for(async_llm: Any) -> HealthFrame:
    """The one health state of ``async_llm`` (created SERVING on first use: vLLM's launcher
    builds its servicers once the engine has started)."""
    frame = _FRAMES.get(async_llm)
    if frame is None:
        frame = HealthFrame(SERVICE_NAME, probe=_probe_for(async_llm))
        frame.set_serving()
        _FRAMES[async_llm] = frame
    return frame


class VllmHealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self, async_llm: Any) -> None:
        self.async_llm = async_llm
        self.frame = health_for(async_llm)

    def set_not_serving(self) -> None:
        self.frame.enter_shutdown()
        deadline = plugin.shutdown_deadline()  # None outside vLLM's launcher process
        if deadline is not None:
            deadline.arm()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        return await self.frame.Check(request, context)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        async for response in self.frame.Watch(request, context):
            yield response

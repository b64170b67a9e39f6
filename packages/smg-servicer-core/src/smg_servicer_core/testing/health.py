"""Health checks shared by every engine's tests: ``grpc.health.v1`` ``Check`` and ``Watch`` and the
engine's own ``HealthCheck`` must agree, follow the engine probe and go NOT_SERVING at shutdown.

    await assert_health_follows_probe(
        channel, engine_stub, wire, service=..., fail=..., recover=..., reason=...
    )
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import ModuleType
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WAIT_S = 10.0


class Watcher:
    """One ``Watch`` stream, read in the background; :meth:`until` waits for a status."""

    def __init__(self, channel: grpc.aio.Channel, service: str = "") -> None:
        stub: Any = health_pb2_grpc.HealthStub(channel)
        self.call = stub.Watch(health_pb2.HealthCheckRequest(service=service))
        self.seen: list[int] = []
        self._changed = asyncio.Condition()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for update in self.call:
            async with self._changed:
                self.seen.append(update.status)
                self._changed.notify_all()

    async def until(self, status: int, timeout_s: float = WAIT_S) -> None:
        async def seen() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self.seen) and self.seen[-1] == status)

        await asyncio.wait_for(seen(), timeout_s)

    def close(self) -> None:
        self.call.cancel()
        self._task.cancel()


async def check(channel: grpc.aio.Channel, service: str = "") -> int:
    stub: Any = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return int(response.status)


async def engine_health(stub: Any, wire: ModuleType) -> tuple[bool, str]:
    response = await stub.HealthCheck(wire.HealthCheckRequest(), timeout=30)
    return bool(response.healthy), str(response.message)


async def assert_health_follows_probe(
    channel: grpc.aio.Channel,
    stub: Any,
    wire: ModuleType,
    *,
    service: str,
    fail: Callable[[], None],
    recover: Callable[[], None],
    reason: str,
) -> None:
    """SERVING; ``fail()`` -> NOT_SERVING on Check, Watch and ``HealthCheck`` (its message
    starting with ``reason``);
    ``recover()`` -> SERVING on all three again."""
    watcher = Watcher(channel, service)
    try:
        await watcher.until(SERVING)
        assert await check(channel) == SERVING
        assert (await engine_health(stub, wire))[0]
        fail()
        await watcher.until(NOT_SERVING)  # Watch probes on its own: nobody asked again
        assert await check(channel, service) == NOT_SERVING
        assert await check(channel) == NOT_SERVING
        healthy, message = await engine_health(stub, wire)
        assert not healthy
        assert message.startswith(reason), message
        recover()
        await watcher.until(SERVING)
        assert await check(channel, service) == SERVING
        assert (await engine_health(stub, wire))[0]
    finally:
        watcher.close()


async def assert_not_serving_from_shutdown(
    channel: grpc.aio.Channel,
    stub: Any,
    wire: ModuleType,
    *,
    service: str,
    start_shutdown: Callable[[], None],
) -> None:
    """While calls still drain after ``start_shutdown()`` (the SIGTERM path), Check, Watch and
    ``HealthCheck`` already say NOT_SERVING. Keep a call in flight so the drain lasts."""
    watcher = Watcher(channel, service)
    try:
        await watcher.until(SERVING)
        start_shutdown()
        await watcher.until(NOT_SERVING)
        assert await check(channel, service) == NOT_SERVING
        try:
            healthy, _ = await engine_health(stub, wire)
        except grpc.aio.AioRpcError as err:  # core's drain gate refuses the engine service
            healthy = err.code() != grpc.StatusCode.UNAVAILABLE
        assert not healthy
    finally:
        watcher.close()

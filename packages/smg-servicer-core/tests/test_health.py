"""One health state: grpc.health.v1 Check/Watch and the engine's HealthCheck follow the probe."""

from __future__ import annotations

import asyncio

import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc

from smg_servicer_core.health import NOT_SERVING, SERVING, HealthFrame
from smg_servicer_core.testing import FakeEngine, FakeEngineServicer, FakeScript, running_server
from smg_servicer_core.testing.fake_servicer import SERVICE_NAME
from smg_servicer_core.testing.health import (
    Watcher,
    assert_health_follows_probe,
    assert_not_serving_from_shutdown,
    check,
    engine_health,
)
from smg_servicer_core.testing.requests import mlx_generate

pytestmark = pytest.mark.contract


async def test_not_serving_until_ready_then_follows_the_probe() -> None:
    engine = FakeEngine(ready_delay_s=0.3)
    health = HealthFrame(SERVICE_NAME)
    servicer = FakeEngineServicer(engine, health)
    async with running_server([servicer.binding()], health, engine) as srv:
        stub = mlx_engine_pb2_grpc.MlxEngineStub(srv.channel)
        watcher = Watcher(srv.channel)
        await watcher.until(NOT_SERVING)
        assert await engine_health(stub, pb) == (False, "engine starting")
        watcher.close()

        def fail() -> None:
            engine.unhealthy = "device lost"

        def recover() -> None:
            engine.unhealthy = None

        await assert_health_follows_probe(
            srv.channel, stub, pb, service=SERVICE_NAME, fail=fail, recover=recover,
            reason="device lost",
        )  # fmt: skip


async def test_shutdown_is_not_serving_while_calls_drain() -> None:
    engine = FakeEngine(script=FakeScript(token_delay_s=0.02))
    health = HealthFrame(SERVICE_NAME)
    servicer = FakeEngineServicer(engine, health)
    async with running_server(
        [servicer.binding()], health, engine, in_flight=lambda: len(servicer.registry)
    ) as srv:
        stub = mlx_engine_pb2_grpc.MlxEngineStub(srv.channel)
        held = stub.Generate(mlx_generate([1, 2], stream=True, max_tokens=50))
        await held.read()
        await assert_not_serving_from_shutdown(
            srv.channel, stub, pb, service=SERVICE_NAME, start_shutdown=srv.stop_event.set
        )
        health.set_serving()  # a late readiness signal cannot undo the shutdown
        assert await check(srv.channel) == NOT_SERVING
        held.cancel()


async def test_a_probe_that_hangs_or_raises_is_not_serving_without_its_text() -> None:
    health = HealthFrame(SERVICE_NAME, probe_timeout_s=0.1)
    health.set_serving()

    async def hangs() -> str | None:
        await asyncio.sleep(10)
        return None

    async def raises() -> str | None:
        raise RuntimeError("secret token abc123")

    health.probe = hangs
    assert await health.status() == NOT_SERVING
    assert await health.reason() == "engine health probe timed out after 0.1s"
    health.probe = raises
    assert await health.status(SERVICE_NAME) == NOT_SERVING
    reason = await health.reason()
    assert reason == "engine health probe failed"
    assert await health.status("unknown.Service") is None
    health.probe = None
    assert await health.status() == SERVING

"""The core contract on the real MLX engine: the shared refusals, one health, exact metrics."""

from __future__ import annotations

import asyncio

import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as pb

from smg_servicer_core.testing.bad_requests import assert_refused_alike
from smg_servicer_core.testing.health import (
    assert_health_follows_probe,
    assert_not_serving_from_shutdown,
)
from smg_servicer_core.testing.metrics import assert_workload_counted, metrics_workload, scrape
from smg_servicer_core.testing.requests import mlx_generate
from smg_servicer_mlx.servicer import SERVICE_NAME

pytestmark = pytest.mark.engine


async def test_the_shared_bad_requests_get_the_shared_messages(mlx_served) -> None:
    limits = mlx_served.servicer.limits
    ran = await assert_refused_alike(
        mlx_served.stub, "mlx", vocab_size=limits.vocab_size, context_length=limits.max_context
    )
    assert ran == 11


async def test_metrics_count_a_known_workload_exactly(mlx_served) -> None:
    work = await metrics_workload(mlx_served.stub, "mlx", [5, 6, 7, 8])
    samples = await asyncio.to_thread(scrape, mlx_served.metrics_port)
    assert work.codes == {"OK": 3, "INVALID_ARGUMENT": 1, "ABORTED": 1}
    assert_workload_counted(samples, work)


async def test_health_follows_the_engine_probe_and_shutdown(mlx_served, monkeypatch) -> None:
    engine = mlx_served.engine
    assert engine.ready
    dead = {"now": False}
    # The engine thread's liveness, as the probe reads it (a real thread cannot die and revive).
    monkeypatch.setattr(type(engine), "dead", property(lambda self: dead["now"]))
    await assert_health_follows_probe(
        mlx_served.server.channel, mlx_served.stub, pb, service=SERVICE_NAME,
        fail=lambda: dead.update(now=True), recover=lambda: dead.update(now=False),
        reason="engine thread stopped",
    )  # fmt: skip
    held = mlx_served.stub.Generate(mlx_generate([1, 2], stream=True, max_tokens=200))
    await held.read()
    await assert_not_serving_from_shutdown(
        mlx_served.server.channel, mlx_served.stub, pb, service=SERVICE_NAME,
        start_shutdown=mlx_served.server.stop_event.set,
    )  # fmt: skip
    held.cancel()

"""The core contract on vLLM: one health under vLLM's own launcher layout, the shared refusals
and exact metrics on the real CPU engine."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2_grpc

from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.proto import vllm_engine_pb2_grpc
from smg_servicer_core.testing.bad_requests import assert_refused_alike
from smg_servicer_core.testing.health import (
    assert_health_follows_probe,
    assert_not_serving_from_shutdown,
)
from smg_servicer_core.testing.metrics import (
    assert_workload_counted,
    engine_gauge,
    metrics_workload,
    scrape,
)

SESSION = pytest.mark.asyncio(loop_scope="session")


@contextlib.asynccontextmanager
async def _launcher_layout(llm: Any) -> AsyncIterator[tuple[Any, Any, grpc.aio.Channel]]:
    """What vllm.entrypoints.launchers.grpc_server builds: both servicers on one server."""
    from smg_grpc_servicer.vllm.health_servicer import VllmHealthServicer
    from smg_grpc_servicer.vllm.servicer import VllmEngineServicer

    servicer = VllmEngineServicer(llm, time.time())
    health = VllmHealthServicer(llm)
    server = grpc.aio.server()
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield health, vllm_engine_pb2_grpc.VllmEngineStub(channel), channel
    finally:
        await channel.close()
        await server.stop(0)


@pytest.mark.contract
@SESSION
async def test_health_follows_the_engine_and_the_launchers_shutdown() -> None:
    from smg_servicer_vllm.testing import FakeAsyncLLM

    llm = FakeAsyncLLM()
    async with _launcher_layout(llm) as (health, stub, channel):
        service = "vllm.grpc.engine.VllmEngine"

        def fail() -> None:
            llm.errored = True

        def recover() -> None:
            llm.errored = False

        await assert_health_follows_probe(
            channel, stub, pb, service=service, fail=fail, recover=recover,
            reason="Engine is not alive",
        )  # fmt: skip
        await assert_not_serving_from_shutdown(
            channel, stub, pb, service=service, start_shutdown=health.set_not_serving
        )
        response = await stub.HealthCheck(pb.HealthCheckRequest())
        assert (response.healthy, response.message) == (False, "shutting down")


@pytest.mark.contract
def test_no_metrics_port_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from smg_servicer_vllm.servicer import VllmEngineServicer
    from smg_servicer_vllm.testing import FakeAsyncLLM

    monkeypatch.delenv("SMG_VLLM_SERVICER_METRICS_PORT", raising=False)
    servicer = VllmEngineServicer(FakeAsyncLLM(), 0.0)
    assert servicer.metrics is None
    assert servicer.metrics_server is None


@pytest.mark.engine
@SESSION
async def test_the_shared_bad_requests_get_the_shared_messages(vllm_stack) -> None:
    servicer, stub = vllm_stack
    config = servicer.engine.model_config
    ran = await assert_refused_alike(
        stub, "vllm", vocab_size=config.get_vocab_size(), context_length=config.max_model_len
    )
    assert ran == 11


@pytest.mark.engine
@SESSION
async def test_metrics_count_a_known_workload_exactly(vllm_stack) -> None:
    servicer, stub = vllm_stack
    port = servicer.metrics_server.port
    before = await asyncio.to_thread(scrape, port)
    work = await metrics_workload(stub, "vllm", [5, 6, 7, 8])
    samples = await asyncio.to_thread(scrape, port)
    assert work.codes == {"OK": 4, "INVALID_ARGUMENT": 1}  # an aborted vLLM stream completes
    assert_workload_counted(samples, work, before)
    assert engine_gauge(samples, "running_requests", dp_rank="0") == 0

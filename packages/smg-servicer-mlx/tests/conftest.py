from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import MetricsServer, ServicerMetrics
from smg_servicer_core.proto import mlx_engine_pb2_grpc
from smg_servicer_core.testing import RunningServer, running_server


@pytest.fixture
def engine_options() -> dict[str, Any]:
    """MlxEngine keyword arguments; override in a test module to size the engine."""
    return {}


@dataclass
class Served:
    engine: Any
    servicer: Any
    stub: Any
    server: RunningServer
    metrics_port: int


@contextlib.asynccontextmanager
async def serving(tiny_model: Path, engine_options: dict[str, Any]) -> AsyncIterator[Served]:
    """Our MLX servicer over a real MlxEngine, with metrics on a free port."""
    from smg_servicer_mlx._engine import MlxEngine
    from smg_servicer_mlx.model_info import read_model_info
    from smg_servicer_mlx.servicer import SERVICE_NAME, MlxServicer

    engine = MlxEngine(read_model_info(tiny_model), **engine_options)
    health = HealthFrame(SERVICE_NAME)
    metrics = ServicerMetrics()
    exporter = MetricsServer(metrics, "127.0.0.1", 0)
    servicer = MlxServicer(engine, health, metrics=metrics)
    engine.start()
    async with running_server(
        [servicer.binding()],
        health,
        engine,
        in_flight=lambda: len(servicer.registry),
        metrics_server=exporter,
    ) as server:
        await engine.wait_ready()
        stub = mlx_engine_pb2_grpc.MlxEngineStub(server.channel)
        yield Served(engine, servicer, stub, server, exporter.port)


@pytest.fixture
async def mlx_served(tiny_model: Path, engine_options: dict[str, Any]) -> AsyncIterator[Served]:
    async with serving(tiny_model, engine_options) as served:
        yield served


@pytest.fixture
def mlx_stack(mlx_served: Served) -> tuple[object, object, object]:
    return mlx_served.engine, mlx_served.servicer, mlx_served.stub


@pytest.fixture
def serve_model() -> Any:
    """``async with serve_model(model_dir, engine_options) as served``: another model served."""
    return serving

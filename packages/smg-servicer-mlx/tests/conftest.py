from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import mlx_engine_pb2_grpc
from smg_servicer_core.testing import cached_tiny_model, running_server

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The float32 tiny Llama, built once per machine under .cache/models."""
    return cached_tiny_model(Path(os.environ.get("SMG_MODEL_CACHE", REPO / ".cache" / "models")))


@pytest.fixture
def engine_options() -> dict[str, Any]:
    """MlxEngine keyword arguments; override in a test module to size the engine."""
    return {}


@pytest.fixture
async def mlx_stack(
    tiny_model: Path, engine_options: dict[str, Any]
) -> AsyncIterator[tuple[object, object, object]]:
    from smg_servicer_mlx._engine import MlxEngine
    from smg_servicer_mlx.model_info import read_model_info
    from smg_servicer_mlx.servicer import SERVICE_NAME, MlxServicer

    engine = MlxEngine(read_model_info(tiny_model), **engine_options)
    health = HealthFrame(SERVICE_NAME)
    servicer = MlxServicer(engine, health)
    engine.start()
    async with running_server(
        [servicer.binding()], health, engine, in_flight=lambda: len(servicer.registry)
    ) as server:
        await engine.wait_ready()
        yield engine, servicer, mlx_engine_pb2_grpc.MlxEngineStub(server.channel)

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from smg_it.harness import Router, Worker, free_port
from smg_servicer_core.testing import cached_tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return cached_tiny_model(Path(os.environ.get("SMG_MODEL_CACHE", REPO / ".cache" / "models")))


@pytest.fixture(scope="module")
def mlx_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "smg_grpc_servicer.mlx",
        "--model",
        str(tiny_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with Worker(cmd, port) as worker, Router(worker.url) as router:
        yield worker, router

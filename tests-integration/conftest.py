from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from smg_it.harness import (
    Router,
    Worker,
    free_port,
    mlx_worker,
    sglang_worker,
    tokenspeed_worker,
    vllm_worker,
)
from smg_servicer_core.testing import cached_tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    root = Path(os.environ.get("SMG_MODEL_CACHE", REPO / ".cache" / "models")).resolve()
    return cached_tiny_model(root)


@pytest.fixture(scope="module")
def mlx_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with mlx_worker(tiny_model, free_port()) as worker, Router(worker.url) as router:
        yield worker, router


@pytest.fixture(scope="module")
def vllm_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with vllm_worker(tiny_model, free_port()) as worker, Router(worker.url) as router:
        yield worker, router


@pytest.fixture(scope="module")
def sglang_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    port = free_port(below=55536)
    with sglang_worker(tiny_model, port) as worker, Router(worker.url) as router:
        yield worker, router


@pytest.fixture(scope="module")
def tokenspeed_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with tokenspeed_worker(tiny_model, free_port()) as worker, Router(worker.url) as router:
        yield worker, router

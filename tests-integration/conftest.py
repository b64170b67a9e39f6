"""One worker of each engine behind the real router, per module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from smg_it.harness import Router, Worker, deployment


@pytest.fixture(scope="module")
def mlx_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with deployment("mlx", tiny_model) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def vllm_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with deployment("vllm", tiny_model) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def sglang_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with deployment("sglang", tiny_model) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def tokenspeed_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    with deployment("tokenspeed", tiny_model) as deployed:
        yield deployed

"""``<engine>_router``: one worker of each engine behind the real router, per module that asks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from smg_it.harness import WORKERS, Router, Worker, deployment


def _deployed(engine: str) -> Callable[..., Iterator[tuple[Worker, Router]]]:
    @pytest.fixture(scope="module", name=f"{engine}_router")
    def deployed(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
        with deployment(engine, tiny_model) as pair:
            yield pair

    return deployed


mlx_router, vllm_router, sglang_router, tokenspeed_router = map(_deployed, WORKERS)

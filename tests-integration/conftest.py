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
    root = Path(os.environ.get("SMG_MODEL_CACHE", REPO / ".cache" / "models")).resolve()
    return cached_tiny_model(root)


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


@pytest.fixture(scope="module")
def vllm_router(tiny_model: Path) -> Iterator[tuple[Worker, Router]]:
    """vLLM's own gRPC launcher (what `vllm serve MODEL --grpc` runs), serving our servicer
    through the facade, with the real router in front."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.grpc_server",
        "--model",
        str(tiny_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(128 << 20),
        "--disable-log-stats",
    ]
    with Worker(cmd, port, start_timeout_s=240) as worker, Router(worker.url) as router:
        yield worker, router

"""Fixtures for the SGLang servicer tests, which run in the SGLang test environment
(``tools/envs/sglang-cpu/install.sh``; ``tools/test.sh`` runs them).

``sglang_server`` is SGLang's own launcher (``sglang serve --smg-grpc-mode``) with our servicer
behind it, started once per session on the float32 tiny model; ``reference`` is what
``sglang.Engine`` itself produces for the same requests (computed in a subprocess).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import Server, free_port, run_reference, start_server, stop_server, wait_serving

from smg_servicer_core.testing import cached_tiny_model

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    root = Path(os.environ.get("SMG_MODEL_CACHE", REPO / ".cache" / "models")).resolve()
    return cached_tiny_model(root)


@pytest.fixture(scope="session")
def sglang_server(tiny_model: Path) -> Iterator[Server]:
    # A random model pads free JSON whitespace forever; the engine option keeps constrained
    # output tight (the same as vLLM's disable_any_whitespace in its tests).
    metrics_port = free_port()
    server = start_server(
        tiny_model,
        "--constrained-json-disable-any-whitespace",
        env={"SMG_SGLANG_SERVICER_METRICS_PORT": str(metrics_port)},
    )
    server.metrics_port = metrics_port
    try:
        wait_serving(server)
        yield server
    finally:
        children = server.children()
        code = stop_server(server)
        gone, alive = psutil.wait_procs(children, timeout=10)
        del gone
        for proc in alive:
            proc.kill()
        # SIGTERM is a clean stop: exit 0 and no scheduler left behind.
        assert code == 0, server.tail()
        assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"


@pytest.fixture(scope="session")
def reference(tiny_model: Path) -> Any:
    """``sglang.Engine``'s own outputs for :data:`reference_run.CASES`."""
    return run_reference(tiny_model)

"""Fixtures for the SGLang servicer tests, which run in the SGLang test environment
(``tools/envs/sglang-cpu/install.sh``; ``tools/test.sh`` runs them).

``sglang_server`` is SGLang's own launcher (``sglang serve --smg-grpc-mode``) with our servicer
behind it, started once per session on the float32 tiny model; ``reference`` is what
``sglang.Engine`` itself produces for the same requests (computed in a subprocess).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smg_it.harness import free_port, stop_tree
from smg_it.sglang_suite import Server, run_reference, start_server


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
        server.wait_serving()
        yield server
    finally:
        code, alive = stop_tree(server)
        # SIGTERM is a clean stop: exit 0 and no scheduler left behind.
        assert code == 0, server.tail()
        assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"


@pytest.fixture(scope="session")
def reference(tiny_model: Path) -> Any:
    """``sglang.Engine``'s own outputs for :data:`smg_it.sglang_reference.CASES`."""
    return run_reference(tiny_model)

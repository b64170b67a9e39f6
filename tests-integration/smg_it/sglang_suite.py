"""The SGLang suite's servers (``packages/smg-servicer-sglang/tests``, run in the SGLang test
environment): SGLang's own launcher with our servicer behind it, from this interpreter, and
``sglang.Engine``'s own outputs to compare with (:mod:`smg_it.sglang_reference`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import smg_it
from smg_it.harness import free_port, sglang_worker
from smg_servicer_core.config import environment
from smg_servicer_core.testing.process import WorkerProcess
from smg_servicer_core.testing.requests import SERVICES

SERVICE = SERVICES["sglang"]

Server = WorkerProcess


def start_server(
    model: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    mode_flag: str = "--smg-grpc-mode",
) -> Server:
    """``sglang serve --smg-grpc-mode`` on the tiny model from this environment, started (wait
    with ``server.wait_serving()``)."""
    python = Path(sys.executable)
    worker = sglang_worker(model, free_port(), *extra, python=python, env=env, mode_flag=mode_flag)
    return worker.start()


def run_reference(model: Path, *flags: str, env: dict[str, str] | None = None) -> Any:
    """:mod:`smg_it.sglang_reference` (``sglang.Engine`` in its own process, with ``env`` added to
    its environment) -> its JSON result."""
    from smg_servicer_sglang.testing import CPU_ENV

    out = Path(tempfile.mkstemp(prefix="smg-sglang-ref-", suffix=".json")[1])
    # As a module (-m), so the kit's own folder is not on its path: the kit's modules would
    # shadow SGLang's imports.
    kit = str(Path(smg_it.__file__).parent.parent)
    path = os.pathsep.join(p for p in (kit, environment().get("PYTHONPATH", "")) if p)
    subprocess.run(
        [sys.executable, "-m", "smg_it.sglang_reference", str(model), str(out), *flags],
        check=True,
        env={**environment(), **CPU_ENV, **(env or {}), "PYTHONPATH": path},
        timeout=300,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())

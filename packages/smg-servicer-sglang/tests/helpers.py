"""Helpers shared by the SGLang servicer tests (servers on the real scheduler)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from smg_servicer_core.testing.process import WorkerProcess, free_port, start_worker
from smg_servicer_sglang.testing import CPU_ENV, serve_command

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SERVICE = "sglang.grpc.scheduler.SglangScheduler"


Server = WorkerProcess


def start_server(
    model: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    mode_flag: str = "--smg-grpc-mode",
) -> Server:
    port = free_port()
    cmd = serve_command(model, port, *extra, python=Path(sys.executable), mode_flag=mode_flag)
    return start_worker(cmd, port, SERVICE, env={**CPU_ENV, **(env or {})})


def wait_serving(server: Server, timeout_s: float = 240.0) -> None:
    server.wait_serving(timeout_s)


def stop_server(server: Server, grace_s: float = 30.0) -> int:
    return server.stop(grace_s)


def run_reference(model: Path, *flags: str) -> Any:
    """``reference_run.py`` (``sglang.Engine`` in its own process) -> its JSON result."""
    out = Path(tempfile.mkstemp(prefix="smg-sglang-ref-", suffix=".json")[1])
    subprocess.run(
        [sys.executable, str(Path(__file__).with_name("reference_run.py")), str(model), str(out),
         *flags],
        check=True,
        env={**os.environ, **CPU_ENV},
        timeout=300,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return json.loads(out.read_text())

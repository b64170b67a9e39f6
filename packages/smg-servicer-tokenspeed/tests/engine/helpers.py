"""Helpers shared by the TokenSpeed servicer tests (the worker on the stand-in scheduler)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psutil

from smg_servicer_core.testing.process import WorkerProcess, free_port, start_worker
from smg_servicer_tokenspeed.testing import serve_command, standin_env

SERVICE = "tokenspeed.grpc.scheduler.TokenSpeedScheduler"
SECRET = "s3cr3t-value"


class Record:
    """What the stand-in scheduler received, one dict per message."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in rows if kind is None or r["type"] == kind]

    def rids(self, kind: str) -> list[str]:
        return [r["rid"] for r in self.entries(kind)]


def start_ts(
    model: Path, record: Path, *extra: str, env: dict[str, str] | None = None, **options: Any
) -> WorkerProcess:
    """The worker through the facade, the stand-in scheduler recording to ``record``."""
    port = free_port()
    cmd = serve_command(model, port, *extra, python=Path(sys.executable))
    return start_worker(cmd, port, SERVICE, env={**standin_env(record=str(record), **options),
                                                 **(env or {})})  # fmt: skip


def stop_clean(server: WorkerProcess) -> tuple[int, list[psutil.Process]]:
    """SIGTERM, then what was left running of its process tree."""
    children = server.children()
    code = server.stop()
    _, alive = psutil.wait_procs(children, timeout=10)
    for proc in alive:
        proc.kill()
    return code, alive

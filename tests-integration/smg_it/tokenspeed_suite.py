"""The TokenSpeed suite's worker (``packages/smg-servicer-tokenspeed/tests/engine``, run in the
TokenSpeed test environment): the facade's entry on TokenSpeed's real front end from this
interpreter, the scheduler stand-in recording what it receives."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psutil

from smg_it.harness import free_port, tokenspeed_worker
from smg_servicer_core.testing.process import WorkerProcess
from smg_servicer_core.testing.requests import SERVICES

SERVICE = SERVICES["tokenspeed"]
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
    """The worker through the facade, the stand-in scheduler recording to ``record``; started
    (wait with ``server.wait_serving()``)."""
    worker = tokenspeed_worker(
        model, free_port(), *extra, python=Path(sys.executable), env=env,
        record=str(record), **options,
    )  # fmt: skip
    return worker.start()


def scheduler_ranks(worker: WorkerProcess) -> list[psutil.Process]:
    """The scheduler ranks under a headless or Rust-lane launcher (spawned: TokenSpeed's start
    method)."""
    return [p for p in worker.children() if "spawn_main" in " ".join(p.cmdline())]

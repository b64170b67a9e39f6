"""Process lifecycle of ``sglang serve --smg-grpc-mode`` with our servicer: exit 1 when a
scheduler dies, exit 2 on a bad configuration; nothing left running. (The drain on SIGTERM with
a stream in flight is the session server's end: conftest.py.)"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil
import pytest

from smg_it.sglang_suite import Server, start_server

pytestmark = pytest.mark.engine


def scheduler_processes(root: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in root.children(recursive=True):
        try:
            if "sglang::scheduler" in " ".join(child.cmdline()) or "schedul" in child.name():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_scheduler_death_exits_1_within_seconds(kv_server: Server) -> None:
    """The KV tests' server (session-wide, done with by now): its scheduler killed, the worker
    exits 1 within seconds and leaves nothing. (SIGTERM's drain with a stream in flight: the
    session server's end, conftest.py.)"""
    server = kv_server
    root = psutil.Process(server.proc.pid)
    schedulers = scheduler_processes(root)
    assert schedulers, "no scheduler process found"
    everything = root.children(recursive=True)
    started = time.monotonic()
    schedulers[0].kill()
    code = server.proc.wait(30)
    elapsed = time.monotonic() - started
    assert code == 1, server.tail()
    # A hang check, not a timing: healthy runs exit in 2-3 s (2.1 and 2.7 s in a full gate run),
    # a missed death never exits; the bound leaves about 4x.
    assert elapsed < 10, f"took {elapsed:.1f}s to exit"
    assert "engine died: scheduler process" in server.tail()
    _, alive = psutil.wait_procs(everything, timeout=15)
    assert not alive, f"left running: {[p.pid for p in alive]}"


def test_bad_kv_events_config_exits_2(tiny_model: Path) -> None:
    server = start_server(tiny_model, "--kv-events-config", "{not json")
    try:
        code = server.proc.wait(120)
    except subprocess.TimeoutExpired:
        server.stop()
        raise
    assert code == 2, server.tail()
    assert "kv-events-config" in server.tail()

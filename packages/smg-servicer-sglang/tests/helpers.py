"""Helpers shared by the SGLang servicer tests (servers on the real scheduler)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_servicer_sglang.testing import CPU_ENV, serve_command

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SERVICE = "sglang.grpc.scheduler.SglangScheduler"


def free_port() -> int:
    """A free port below 55535 (SGLang derives a legacy port at +10000)."""
    for _ in range(100):
        port = 20000 + int.from_bytes(os.urandom(2)) % 30000
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    metrics_port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def start_server(model: Path, *extra: str, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="smg-sglang-", suffix=".log")[1])
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            serve_command(model, port, *extra, python=Path(sys.executable)),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CPU_ENV, **(env or {})},
        )
    return Server(proc, port, log)


def wait_serving(server: Server, timeout_s: float = 240.0) -> None:
    """Until grpc.health.v1 says SERVING for the engine service (bounded)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(server.address) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"server exited {server.proc.returncode}:\n{server.tail()}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.25)
    raise TimeoutError(f"not SERVING within {timeout_s}s:\n{server.tail()}")


def stop_server(server: Server, grace_s: float = 30.0) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(10)
    return server.proc.returncode


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

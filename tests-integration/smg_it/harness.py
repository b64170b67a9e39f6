"""Processes for integration runs: a worker command and the real router, both on 127.0.0.1.

    with Worker(cmd, port) as worker, Router(worker.url) as router:
        httpx.post(router.base + "/v1/chat/completions", json=...)

Every wait is bounded; both processes are stopped by PID (SIGTERM, then SIGKILL after a grace
period), never by process group, so a test runner wrapping us is not signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx


def free_port(below: int = 65536) -> int:
    """A free loopback port (``below`` a ceiling: SGLang refuses ports above 55535)."""
    for _ in range(200):
        with socket.socket() as sock:
            if below >= 65536:
                sock.bind(("127.0.0.1", 0))
                return int(sock.getsockname()[1])
            port = 20000 + int.from_bytes(os.urandom(2)) % (below - 20000)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(
        f"nothing listened on {port} within {timeout_s}s:\n{log.read_text()[-3000:]}"
    )


class _Process:
    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        self.env = {**os.environ, **(env or {})}
        self.log = Path(tempfile.mkstemp(prefix="smg-it-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        self._log_fh = self.log.open("wb")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log_fh, stderr=subprocess.STDOUT, env=self.env
        )
        return self.proc

    def stop(self, grace_s: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log_fh is not None:
            self._log_fh.close()
        return self.proc.returncode


class Worker(_Process):
    """An SMG worker command listening on ``port``."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        *,
        start_timeout_s: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(cmd, env)
        self.port = port
        self.url = f"grpc://127.0.0.1:{port}"
        self.start_timeout_s = start_timeout_s

    def __enter__(self) -> Self:
        _wait_port(self.port, self.start(), self.start_timeout_s, self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Router(_Process):
    """``smg launch`` in front of one worker, round-robin, on loopback only."""

    def __init__(
        self,
        worker_url: str,
        *extra: str,
        start_timeout_s: float = 120.0,
        policy: str = "round_robin",
        shutdown_grace_s: int = 1,
    ) -> None:
        self.port, metrics = free_port(), free_port()
        super().__init__(
            [
                sys.executable,
                "-m",
                "smg",
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(metrics),
                "--worker-urls",
                worker_url,
                "--policy",
                policy,
                "--log-level",
                "info",
                "--worker-startup-check-interval",
                "1",
                # Its default (180 s) still spends ~5 s on a SIGTERM with nothing in flight.
                "--shutdown-grace-period-secs",
                str(shutdown_grace_s),
                *extra,
            ],
            # A tokenizer path the router cannot read locally makes it try the hub first: point
            # the hub at a closed loopback port so that attempt fails at once, with no traffic.
            env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"},
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s

    def __enter__(self) -> Self:
        proc = self.start()
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"router exited {proc.returncode}:\n{self.log.read_text()}")
            try:
                response = httpx.get(self.base + "/readiness", timeout=2)
                if response.status_code == 200:
                    return self
                last = response.text
            except httpx.HTTPError as err:
                last = repr(err)
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"router not ready: {last}\n{self.log.read_text()[-3000:]}")

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(grace_s=5)


def mlx_worker(model: Path, port: int, *extra: str) -> Worker:
    """The MLX servicer, launched the way the seed README documents (through the facade)."""
    return Worker(
        [
            sys.executable,
            "-m",
            "smg_grpc_servicer.mlx",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra,
        ],
        port,
    )


def vllm_worker(model: Path, port: int, *extra: str) -> Worker:
    """vLLM's own gRPC launcher (what ``vllm serve MODEL --grpc`` runs), which imports our
    servicer through ``smg_grpc_servicer.vllm``; CPU-sized for the tiny model."""
    from smg_servicer_vllm.testing import launcher_command

    return Worker(launcher_command(model, port, *extra), port, start_timeout_s=240)


def sglang_worker(model: Path, port: int, *extra: str) -> Worker:
    """SGLang's own launcher, ``sglang serve --smg-grpc-mode``, which calls our servicer through
    ``smg_grpc_servicer.sglang.server.serve_grpc``; from the SGLang test environment
    (``.venv-sglang``; a missing one fails here with the command that builds it)."""
    from smg_servicer_sglang.testing import CPU_ENV, serve_command

    return Worker(serve_command(model, port, *extra), port, start_timeout_s=240, env=CPU_ENV)


def tokenspeed_worker(model: Path, port: int, *extra: str, **standin: object) -> Worker:
    """``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns) from the TokenSpeed
    test environment (``.venv-tokenspeed``; a missing one fails here with the command that builds
    it): TokenSpeed's real front end, its GPU scheduler replaced by the stand-in."""
    from smg_servicer_tokenspeed.testing import serve_command, standin_env

    return Worker(
        serve_command(model, port, *extra),
        port,
        start_timeout_s=240,
        env=standin_env(**standin),
    )

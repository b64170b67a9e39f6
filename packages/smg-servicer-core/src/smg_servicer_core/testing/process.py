"""Server processes for tests: one that reports its bound port through a file
(``--port-file``), one that says it is ready in a line of its output (:func:`spawn_until_line`),
and :class:`WorkerProcess`, a worker launched as users launch it (:func:`start_worker`; the
router in front of one is :class:`smg_servicer_core.testing.router.Router`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_servicer_core.config import environment


def spawn_with_port_file(
    cmd: Sequence[str],
    port_file: Path,
    *,
    timeout_s: float = 30.0,
    output: int | IO[bytes] | None = subprocess.PIPE,
    env: Mapping[str, str] | None = None,
    cpus: set[int] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Run ``cmd`` (which must write its port to ``port_file``); return it and the port.
    ``cpus``: the CPUs the process (and every thread it starts) may run on.

    The process is killed, and its output shown, if it exits or stays silent past ``timeout_s``.
    """
    proc = subprocess.Popen(list(cmd), stdout=output, stderr=subprocess.STDOUT, env=env)
    if cpus:  # before the interpreter has started any thread: they all inherit it
        os.sched_setaffinity(proc.pid, cpus)
    deadline = time.monotonic() + timeout_s
    # A writer that is not atomic leaves the file empty for a moment: wait for a whole number.
    while not (text := _read_if_there(port_file)).strip().isdigit():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.communicate()[0] or b""
            raise RuntimeError(f"server did not start: {out.decode(errors='replace')[-3000:]}")
        time.sleep(0.02)
    return proc, int(text)


def _read_if_there(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def announce_port(port_file: Path, port: int) -> None:
    """Write ``port`` to ``port_file`` at once (a reader never sees it half written)."""
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(str(port))
    tmp.replace(port_file)


def fake_server_command(port_file: Path, *flags: str) -> list[str]:
    """``python -m smg_servicer_core.testing`` on 127.0.0.1, port 0, reporting to ``port_file``."""
    return [
        sys.executable,
        "-m",
        "smg_servicer_core.testing",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        *flags,
    ]


def spawn_until_line(
    cmd: Sequence[str],
    marker: bytes,
    on_line: Callable[[bytes], None],
    *,
    what: str,
    output: Callable[[], str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    on_eof: Callable[[], None] | None = None,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Run ``cmd`` and return once a line of its output holds ``marker``.

    A thread hands every line (stdout and stderr) to ``on_line`` for the process's whole life
    (so the pipe never fills), then calls ``on_eof``. If the process exits or stays silent past
    ``timeout_s`` it is killed, and the error shows the tail of ``output()``.
    """
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env) if env is not None else None,
        start_new_session=new_session,
    )
    ready = threading.Event()
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        for line in iter(stdout.readline, b""):
            on_line(line)
            if marker in line:
                ready.set()
        if on_eof is not None:
            on_eof()
        ready.set()  # exited: the wait below ends and the check reports it

    threading.Thread(target=pump, name=f"{what}-output", daemon=True).start()
    if not ready.wait(timeout_s) or proc.poll() is not None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} did not start:\n{output()[-4000:]}")
    return proc


#: The ports :func:`free_port` handed out in this process (never handed out twice).
_HANDED_OUT: set[int] = set()
#: ``LOW-HIGH`` (HIGH excluded): the ports :func:`free_port` draws from in this process.
#: ``tools/test.sh`` and ``.ci/run`` give each of the test sessions they run at once a range of
#: its own, so that two sessions never hand out the same port: a port is checked free here and
#: bound by an engine seconds later (KV-event ports once the model has loaded), and another
#: session could pick it meanwhile (a gate run lost an SGLang DP worker's replay port so).
PORT_RANGE_ENV = "SMG_TEST_PORT_RANGE"


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range(top: int) -> tuple[int, int]:
    """[low, high) of :func:`free_port`: from 20000 to ``top``, narrowed to
    :data:`PORT_RANGE_ENV` when it is set; a malformed or empty range is an error."""
    low = 20000
    spec = environment().get(PORT_RANGE_ENV, "")
    if spec:
        first, _, last = spec.partition("-")
        try:
            low, top = max(low, int(first)), min(top, int(last))
        except ValueError:
            raise RuntimeError(f"{PORT_RANGE_ENV}={spec!r}: expected LOW-HIGH") from None
    if top <= low:
        raise RuntimeError(f"no free port: the range [{low}, {top}) is empty ({PORT_RANGE_ENV})")
    return low, top


def free_port(below: int = 55536) -> int:
    """A free loopback port in [20000, ``below``) and under the kernel's ephemeral range (within
    :data:`PORT_RANGE_ENV` when set), never handed out twice by this process. Under the
    ephemeral range: between this check and the worker's bind, any outgoing connection on the
    machine (an engine's own TCP store, an HTTP client) may take a port in that range (a gate
    run lost an SGLang worker to it). SGLang derives a port at +10000, so its workers stay below
    55536."""
    low, top = _port_range(min(below, _ephemeral_low()))
    for _ in range(200):
        port = low + int.from_bytes(os.urandom(2), "big") % (top - low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port")


def wait_serving(
    address: str,
    service: str = "",
    *,
    timeout_s: float = 240.0,
    interval_s: float = 0.25,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Until ``grpc.health.v1`` at ``address`` says SERVING for ``service`` (bounded).
    ``alive`` returns a reason once the process behind it has gone (RuntimeError with it)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            gone = alive() if alive is not None else None
            if gone is not None:
                raise RuntimeError(gone)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(interval_s)
    raise TimeoutError(f"{address} not SERVING within {timeout_s}s")


@dataclass
class WorkerProcess:
    """A worker launched as users launch it, its output in a log file; every wait is bounded and
    it is stopped by PID (SIGTERM, then SIGKILL after a grace period)."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    #: The engine service ``grpc.health.v1`` is asked about.
    service: str
    metrics_port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def wait_serving(self, timeout_s: float = 240.0) -> None:
        """Until ``grpc.health.v1`` says SERVING for the engine service."""

        def alive() -> str | None:
            code = self.proc.poll()
            return None if code is None else f"exited {code}:\n{self.tail()}"

        try:
            wait_serving(self.address, self.service, timeout_s=timeout_s, alive=alive)
        except TimeoutError as err:
            raise TimeoutError(f"not SERVING within {timeout_s}s:\n{self.tail()}") from err

    def wait_listening(self, timeout_s: float = 120.0) -> None:
        """Until something listens on the worker's port (bounded; fails at once when the process
        exits, with the tail of its log)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"process exited {self.proc.returncode}:\n{self.tail(3000)}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError(
            f"nothing listened on {self.port} within {timeout_s}s:\n{self.tail(3000)}"
        )

    def stop(self, grace_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_worker(
    cmd: Sequence[str], port: int, service: str, env: dict[str, str] | None = None
) -> WorkerProcess:
    """Start ``cmd`` (which listens on ``port``) with ``env`` added to this environment."""
    log = Path(tempfile.mkstemp(prefix="smg-worker-", suffix=".log")[1])
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            list(cmd), stdout=fh, stderr=subprocess.STDOUT, env={**environment(), **(env or {})}
        )
    return WorkerProcess(proc, port, log, service)

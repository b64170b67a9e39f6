"""A real ``redis-server`` for tests (the Debian package): 127.0.0.1, a free port, no
persistence. It can be killed and started again on the same port (an outage, then recovery).

A missing binary fails loudly: the suites that need Redis must not skip in CI.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from types import TracebackType

from smg_servicer_core.testing.process import free_port, spawn_until_line

READY = b"Ready to accept connections"
INSTALL_HINT = "redis-server is not installed (Debian: apt-get install -y redis-server)"


class RedisServer:
    """``with RedisServer() as redis: redis.url`` — ``kill()`` and ``start()`` again at will."""

    def __init__(self, *, password: str | None = None, start_timeout_s: float = 15.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.binary = binary
        self.port = free_port()
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: collections.deque[bytes] = collections.deque(maxlen=200)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no", "--loglevel", "notice"]
        if self.password:
            cmd += ["--requirepass", self.password]
        self.proc = spawn_until_line(
            cmd,
            READY,
            self.log.append,
            what=f"redis-server on port {self.port}",
            output=lambda: b"".join(self.log).decode(errors="replace"),
            timeout_s=self.start_timeout_s,
        )
        return self

    def kill(self) -> None:
        """SIGKILL: the data is gone (no persistence), as after a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

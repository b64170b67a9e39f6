"""A real ``redis-server`` for tests (the Debian package): 127.0.0.1, a free port, no
persistence. It can be killed and started again on the same port (an outage, then recovery).

Optionally TLS only (``tls=RedisTlsFiles(...)``: the port speaks TLS and nothing else, its URL is
``rediss://``; Debian's build has TLS) and an ACL user (``user=`` with ``password=``: that user
may do everything, and the ``default`` user is switched off, so every connection must log in as
it). Certificates for it come from :mod:`smg_servicer_core.testing.certs`.

A missing binary fails loudly: the suites that need Redis must not skip in CI.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from smg_servicer_core.testing.process import free_port, spawn_until_line

READY = b"Ready to accept connections"
INSTALL_HINT = "redis-server is not installed (Debian: apt-get install -y redis-server)"


@dataclass(frozen=True)
class RedisTlsFiles:
    """The server's certificate and key, the CA its clients' certificates must chain to, and
    whether it demands one (``tls-auth-clients yes``)."""

    cert: Path
    key: Path
    ca: Path
    auth_clients: bool = False


class RedisServer:
    """``with RedisServer() as redis: redis.url`` — ``kill()`` and ``start()`` again at will."""

    def __init__(
        self,
        *,
        password: str | None = None,
        user: str | None = None,
        tls: RedisTlsFiles | None = None,
        acl: tuple[str, ...] = ("~*", "&*", "+@all"),
        start_timeout_s: float = 15.0,
    ) -> None:
        """``acl``: the rules of ``user`` (default: every key, channel and command)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        if user is not None and not password:
            raise ValueError("an ACL user needs a password")
        self.binary = binary
        self.port = free_port()
        self.password = password
        self.user = user
        self.tls = tls
        self.acl = acl
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: collections.deque[bytes] = collections.deque(maxlen=200)

    @property
    def url(self) -> str:
        return self.url_as(self.user, self.password)

    def url_as(self, user: str | None, password: str | None) -> str:
        """The URL with other credentials (a wrong password, another user)."""
        auth = f"{user or ''}:{password}@" if password else ""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        port = ["--port", str(self.port)]
        if self.tls is not None:
            port = ["--port", "0", "--tls-port", str(self.port)]
            port += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            port += ["--tls-ca-cert-file", str(self.tls.ca)]
            port += ["--tls-auth-clients", "yes" if self.tls.auth_clients else "no"]
        cmd = [self.binary, *port, "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no", "--loglevel", "notice"]
        if self.user is not None:
            cmd += ["--user", "default", "off"]
            cmd += ["--user", self.user, "on", f">{self.password}", *self.acl]
        elif self.password:
            cmd += ["--requirepass", self.password]
        return cmd

    def start(self) -> RedisServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        cmd = self._command()
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

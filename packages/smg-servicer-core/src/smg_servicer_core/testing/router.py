"""The real SMG router (``smg launch``, ``pip install smg``) in front of one worker, on loopback.

    with Router("grpc://127.0.0.1:50051") as router:
        urllib.request.urlopen(router.base + "/v1/models")

Started through :func:`~smg_servicer_core.testing.process.start_worker` (its output in a log
file), ready once ``/readiness`` answers 200, stopped by PID
(:meth:`~smg_servicer_core.testing.process.WorkerProcess.stop`); every wait is bounded.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from smg_servicer_core.testing.process import WorkerProcess, free_port, start_worker

#: Loopback needs no proxy, whatever the environment says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Router:
    """``smg launch`` in front of ``worker_url`` (round-robin unless ``policy`` says otherwise),
    on 127.0.0.1 with its Prometheus port on loopback too; ``extra``: more router flags."""

    def __init__(
        self,
        worker_url: str,
        *extra: str,
        start_timeout_s: float = 120.0,
        policy: str = "round_robin",
        shutdown_grace_s: int = 1,
    ) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.cmd = [
            sys.executable, "-m", "smg", "launch",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            "--worker-urls", worker_url,
            "--policy", policy,
            "--log-level", "info",
            "--worker-startup-check-interval", "1",
            # Its default (180 s) still spends ~5 s on a SIGTERM with nothing in flight.
            "--shutdown-grace-period-secs", str(shutdown_grace_s),
            *extra,
        ]  # fmt: skip
        # A tokenizer path the router cannot read locally makes it try the hub first: point the
        # hub at a closed loopback port so that attempt fails at once, with no traffic.
        self.env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
        self.base = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self.process: WorkerProcess | None = None

    @property
    def log(self) -> Path:
        if self.process is None:
            raise RuntimeError("the router has not been started")
        return self.process.log

    def start(self) -> WorkerProcess:
        self.process = start_worker(self.cmd, self.port, "", self.env)
        return self.process

    def wait_ready(self) -> None:
        """Until ``/readiness`` answers 200 (RuntimeError at once if the router exits)."""
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            code = self.process.proc.poll()
            if code is not None:
                raise RuntimeError(f"router exited {code}:\n{self.process.tail(100_000)}")
            try:
                with _DIRECT.open(self.base + "/readiness", timeout=2) as response:
                    if response.status == 200:
                        return
                    last = response.read().decode(errors="replace")
            except urllib.error.HTTPError as err:
                last = err.read().decode(errors="replace")
            except OSError as err:
                last = repr(err)
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"router not ready: {last}\n{self.process.tail(3000)}")

    def stop(self, grace_s: float = 5.0) -> int | None:
        return None if self.process is None else self.process.stop(grace_s)

    def __enter__(self) -> Router:
        self.start()
        self.wait_ready()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

"""Test helpers: the sidecar as a real process (``python -m smg_grpc_servicer.vllm.mm_sidecar``,
the facade's command), started, waited for, killed and read."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from smg_servicer_core.config import environment
from smg_servicer_core.testing.process import spawn_until_line

SERVING = "written; serving"


class SidecarProcess:
    """One sidecar; ``start()`` returns once its first hello is in Redis."""

    def __init__(
        self,
        model: Path | str,
        redis_url: str,
        *args: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 180.0,
    ) -> None:
        self.command = [
            sys.executable,
            "-m",
            "smg_grpc_servicer.vllm.mm_sidecar",
            "--model",
            str(model),
            "--redis-url",
            redis_url,
            *args,
        ]
        self.log_path = log_path
        self.env = {**environment(), **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SidecarProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")

        def write(line: bytes) -> None:
            log.write(line)
            log.flush()

        self.proc = spawn_until_line(
            self.command,
            SERVING.encode(),
            write,
            what="the sidecar",
            output=self.log,
            timeout_s=self.start_timeout_s,
            env=self.env,
            on_eof=log.close,
            new_session=True,
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, as a crash: no hello removal, the job in hand lost."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and the exit code (killed past ``timeout_s``)."""
        if self.proc is None:
            return 0
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -9

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def sidecar_args(limit: str = '{"image": 2}', *extra: str) -> Sequence[str]:
    """The engine arguments that match the tests' tiny-VLM worker (float32, 1024 tokens)."""
    return ("--dtype", "float32", "--max-model-len", "1024", "--limit-mm-per-prompt", limit, *extra)

"""Start a server process that reports its bound port through a file (``--port-file``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO


def spawn_with_port_file(
    cmd: Sequence[str],
    port_file: Path,
    *,
    timeout_s: float = 30.0,
    output: int | IO[bytes] | None = subprocess.PIPE,
) -> tuple[subprocess.Popen[bytes], int]:
    """Run ``cmd`` (which must write its port to ``port_file``); return it and the port.

    The process is killed, and its output shown, if it exits or stays silent past ``timeout_s``.
    """
    proc = subprocess.Popen(list(cmd), stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.communicate()[0] or b""
            raise RuntimeError(f"server did not start: {out.decode(errors='replace')[-3000:]}")
        time.sleep(0.02)
    return proc, int(port_file.read_text())


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

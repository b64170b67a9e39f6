"""Where and from what a recorded run came: the machine's description and the checkout's revision,
written into every committed record (``tools/compat/results/``, ``tools/bench/results/``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from smg_it.paths import REPO


def machine() -> str:
    """``Linux x86_64, 2 CPUs <model name>``: enough to tell two machines' records apart."""
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else ""
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs {cpu}".strip()


def revision() -> str:
    """The checkout's short revision, marked when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                          capture_output=True, check=False).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           text=True, capture_output=True, check=False).stdout.strip()  # fmt: skip
    return f"{head}{' (uncommitted changes)' if dirty else ''}"

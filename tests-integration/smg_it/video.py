"""Video for the vLLM video tests (issue #45): a generated clip and the functional torchvision
shim their environment puts first on ``PYTHONPATH`` (tools/envs/list: ``env video``;
``tools/envs/vllm-cpu/shims/torchvision/__init__.py`` says why a shim)."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

from smg_it.paths import REPO

#: The functional torchvision shim's folder (what the video environment's PYTHONPATH holds).
SHIM = REPO / "tools" / "envs" / "vllm-cpu" / "shims"
SHIM_VERSION = "0.26.0+smgshim"


def shim_missing() -> str | None:
    """Why this process cannot process video (no shim first on its path), or None."""
    try:
        torchvision = importlib.import_module("torchvision")
    except ImportError:
        return f"no torchvision: run with PYTHONPATH={SHIM} (tools/envs/list: env video)"
    version = getattr(torchvision, "__version__", "")
    if version != SHIM_VERSION:
        return f"torchvision {version} is not the shim {SHIM_VERSION} ({SHIM})"
    return None


def clip(frames: int = 12, *, seed: int = 0) -> bytes:
    """An mp4 (mp4v, OpenCV) of ``frames`` 64x48 frames at 4 fps: noise drawn from ``seed`` with
    a white bar growing across them (two seeds, two clips the tiny VLM answers differently; a
    clip of flat colours makes its answers all alike)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "clip.mp4")
        fourcc: Any = cv2.VideoWriter_fourcc(*"mp4v")  # pyright: ignore[reportAttributeAccessIssue]
        writer = cv2.VideoWriter(path, fourcc, 4, (64, 48))
        for i in range(frames):
            frame = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
            frame[:, : min(i + 1, 12) * 5] = 255
            writer.write(frame)
        writer.release()
        return Path(path).read_bytes()

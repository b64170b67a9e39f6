"""How to start the MLX servicer for tests, benchmarks and the demo (imports no MLX)."""

from __future__ import annotations

import sys
from pathlib import Path


def serve_command(
    model: str | Path, port: int, *extra: str, python: str | Path | None = None
) -> list[str]:
    """``python -m smg_grpc_servicer.mlx`` (the seed's command, through the facade) on
    127.0.0.1:``port``, logging at warning; then ``extra``. ``model``: a directory or a Hugging
    Face id; ``python``: this interpreter unless given."""
    return [
        str(python or sys.executable), "-m", "smg_grpc_servicer.mlx",
        "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip

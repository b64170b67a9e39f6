"""The README's main command runs end to end and reports what it did."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_main_command_streams_a_reply_and_stops_cleanly() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "demo.py"), "Hi!"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "assistant " in out
    assert "ttft" in out
    assert "completion 64" in out or "completion " in out
    assert "worker exit 0" in out

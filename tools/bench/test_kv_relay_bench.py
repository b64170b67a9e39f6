"""tools/bench/kv_relay_bench.py runs end to end and accounts for every event it sent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).with_name("kv_relay_bench.py")


@pytest.mark.contract
def test_relay_bench_delivers_everything_it_sent() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--rate", "2000", "--events-per-batch", "5", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["events_sent"] > 0
    assert report["events_delivered"] == report["events_sent"]
    assert 0 < report["latency_ms_p50"] <= report["latency_ms_p99"]

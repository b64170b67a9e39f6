"""tools/bench/stacks.py's reading of py-spy's raw files (made-up stacks; nothing is sampled)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from stacks import read, role, summary

pytestmark = pytest.mark.unit

FRONT = 'process 10:"python -m vllm.entrypoints.launchers.grpc_server --model m"'
CORE = 'process 11:"VLLM::EngineCore"'
WORKER = 'process 12:"VLLM::Worker"'
RAW = "\n".join(
    [
        f"{FRONT};main (grpc_server.py:5);serve (aio.py:10) 30",
        f"{FRONT};main (grpc_server.py:5);generate (async_llm.py:400);render (base.py:9) 10",
        f"{FRONT};{CORE};run_busy_loop (core.py:1);step (core.py:2) 40",
        f"{FRONT};{CORE};run_busy_loop (core.py:1);acquire_read (shm_broadcast.py:3) 15",
        f"{FRONT};{CORE};{WORKER};worker_busy_loop (multiproc.py:1);forward (model.py:4) 5",
        "a malformed line",
    ]
)


def test_samples_are_owned_by_the_innermost_process_and_named_by_role(tmp_path: Path) -> None:
    path = tmp_path / "r0-python-c16.txt"
    path.write_text(RAW)
    processes = read(path)
    assert {p.pid: (p.role, p.samples) for p in processes.values()} == {
        10: ("front end", 40),
        11: ("engine core", 55),
        12: ("model worker", 5),
    }
    assert processes[11].self_samples["acquire_read (shm_broadcast.py)"] == 15
    assert role("python -m sglang.launch_server (scheduler_TP0)") == "scheduler"
    packed = tmp_path / "r0-python-c16.txt.gz"
    packed.write_bytes(gzip.compress(RAW.encode()))
    assert {p.pid: p.samples for p in read(packed).values()} == {10: 40, 11: 55, 12: 5}


def test_the_summary_gives_each_role_its_share_and_its_busiest_functions(tmp_path: Path) -> None:
    path = tmp_path / "r0-upstream-c16.txt"
    path.write_text(RAW)
    lines = summary(path, top=1, match=["generate"])
    assert lines[0] == "r0-upstream-c16.txt: 100 samples"
    assert lines[1] == "  engine core (1 process(es)): 55.0 %"
    assert lines[2].split() == ["72.7", "%", "step", "(core.py)"]
    front = lines.index("  front end (1 process(es)): 40.0 %")
    assert lines[front + 1].split() == ["75.0", "%", "serve", "(aio.py)"]
    assert lines[front + 2].split() == ["25.0", "%", "(inclusive)", "generate"]

"""Process lifecycle of ``sglang serve --smg-grpc-mode`` with our servicer: drain on SIGTERM,
exit 1 when a scheduler dies, exit 2 on a bad configuration; nothing left running."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import grpc
import psutil
import pytest

from smg_it.sglang_suite import start_server
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc

pytestmark = pytest.mark.engine


def scheduler_processes(root: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in root.children(recursive=True):
        try:
            if "sglang::scheduler" in " ".join(child.cmdline()) or "schedul" in child.name():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_sigterm_drains_the_stream_in_flight(tiny_model: Path) -> None:
    # The seed's spelling, `sglang serve --grpc-mode` (SGLang maps it to --smg-grpc-mode, which
    # every other test here and the wheel check use).
    server = start_server(tiny_model, mode_flag="--grpc-mode")
    try:
        server.wait_serving()
        children = psutil.Process(server.proc.pid).children(recursive=True)
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            req = pb.GenerateRequest(
                request_id="drain",
                tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
                sampling_params=pb.SamplingParams(max_new_tokens=200, ignore_eos=True),
                stream=True,
            )
            stream = stub.Generate(req, timeout=60)
            first = next(stream)
            assert first.HasField("chunk")
            server.proc.send_signal(signal.SIGTERM)
            rest = list(stream)
        tokens = len(first.chunk.token_ids) + sum(
            len(r.chunk.token_ids) for r in rest if r.HasField("chunk")
        )
        assert rest[-1].complete.finish_reason == "length"
        assert tokens == 200, "the request in flight finished during the drain"
        assert server.proc.wait(60) == 0, server.tail()
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        server.stop()


def test_scheduler_death_exits_1_within_seconds(tiny_model: Path) -> None:
    server = start_server(tiny_model, env={"SMG_SGLANG_SERVICER_WARMUP": "off"})
    try:
        server.wait_serving()
        root = psutil.Process(server.proc.pid)
        schedulers = scheduler_processes(root)
        assert schedulers, "no scheduler process found"
        everything = root.children(recursive=True)
        started = time.monotonic()
        schedulers[0].kill()
        code = server.proc.wait(30)
        elapsed = time.monotonic() - started
        assert code == 1, server.tail()
        assert elapsed < 10, f"took {elapsed:.1f}s to exit"
        assert "engine died: scheduler process" in server.tail()
        _, alive = psutil.wait_procs(everything, timeout=15)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        server.stop()


def test_bad_kv_events_config_exits_2(tiny_model: Path) -> None:
    server = start_server(tiny_model, "--kv-events-config", "{not json")
    try:
        code = server.proc.wait(120)
    except subprocess.TimeoutExpired:
        server.stop()
        raise
    assert code == 2, server.tail()
    assert "kv-events-config" in server.tail()

"""Process lifecycle of ``python -m smg_grpc_servicer.tokenspeed`` on TokenSpeed's front end: a
failed warm-up stays NOT_SERVING, exit 1 when the scheduler dies, exit 2 on bad configuration,
``--help`` shows both flag sets, and ``ts serve``'s own start-up contract. (SIGTERM with a stream
in flight is the session worker's stop, in ``conftest.ts_server``.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.harness import stop_tree
from smg_it.tokenspeed_suite import SERVICE, start_ts
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.process import free_port
from smg_servicer_tokenspeed.testing import serve_command, standin_env
from smg_servicer_tokenspeed.testing.scheduler import CRASH_EXIT

pytestmark = pytest.mark.engine


def stream_request(rid: str, tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(max_new_tokens=tokens),
        stream=True,
    )


def _health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


@pytest.mark.standin
def test_failed_warm_up_stays_not_serving_then_a_crash_exits_1(
    tiny_model: Path, tmp_path: Path
) -> None:
    """One worker for two faults (each start costs TokenSpeed's imports twice): the warm-up the
    scheduler refuses leaves it NOT_SERVING and running; a scheduler crash then ends it with exit
    1 within seconds, the call in flight failed, nothing left running."""
    server = start_ts(
        tiny_model, tmp_path / "record.jsonl", refuse={"WARMUP": 500}, crash_prefix="crash-"
    )
    try:
        deadline = time.monotonic() + 180
        while "warm-up failed" not in server.tail() and time.monotonic() < deadline:
            assert server.proc.poll() is None, server.tail()
            time.sleep(0.2)
        assert "warm-up failed (the stand-in scheduler refused the request (500))" in server.tail()
        for service in ("", SERVICE):
            assert _health(server.address, service) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert server.proc.poll() is None, "a failed warm-up does not end the process"
        everything = server.children()
        assert everything, "no scheduler process"
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.TokenSpeedSchedulerStub(channel)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(stream_request("crash-now", 4), timeout=30))
        code = server.proc.wait(30)
        elapsed = time.monotonic() - started
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)  # pyright: ignore[reportAttributeAccessIssue]
        assert code == 1, server.tail()
        # A bound on a hang-free exit, not a speed figure: the crash is seen at once, then the
        # exit tears down TokenSpeed's front end and the scheduler's tree. Margin: 1.5x the
        # slowest exit seen (13.4 s, in a gate whose other lane kept both cores busy), 2x the
        # 10 s every earlier gate met; a hang fails at the 30 s wait above.
        assert elapsed < 20, f"took {elapsed:.1f}s to exit"
        assert f"exited with code {CRASH_EXIT}" in server.tail()
        _, alive = psutil.wait_procs(everything, timeout=15)
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        stop_tree(server)


@pytest.mark.standin
@pytest.mark.parametrize(
    ("extra", "env", "says"),
    [
        (["--kv-events-config", "{not json"], {}, "kv-events-config"),
        ([], {"SMG_TOKENSPEED_SCHEDULER": "no_such_module:run"}, "SMG_TOKENSPEED_SCHEDULER"),
        (["--grace-period", "-1"], {}, "--grace-period"),
    ],
)
def test_bad_configuration_exits_2(
    tiny_model: Path, extra: list[str], env: dict[str, str], says: str
) -> None:
    cmd = serve_command(tiny_model, free_port(), *extra, python=Path(sys.executable))
    done = subprocess.run(
        cmd,
        env={**os.environ, **standin_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stdout + done.stderr


def test_help_shows_both_flag_sets() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "smg_grpc_servicer.tokenspeed", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "--metrics-port" in out and "--grace-period" in out
    assert "TokenSpeed server flags" in out
    assert "--model" in out and "--enable-output-logprobs" in out


def test_ts_serve_spawns_the_servicer_and_sees_serving(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ts serve``'s own start-up contract, with its own code: the ``find_spec`` checks pass with
    ``TS_SERVE_ENGINE_MODULE`` unset, ``spawn_engine`` starts ``smg_grpc_servicer.tokenspeed``,
    and ``wait_grpc_serving`` sees SERVING."""
    from tokenspeed.cli import _proc  # pyright: ignore[reportMissingImports]
    from tokenspeed.cli.serve_smg import (  # pyright: ignore[reportMissingImports]
        _check_serve_extra_installed,
    )

    monkeypatch.delenv("TS_SERVE_ENGINE_MODULE", raising=False)
    _check_serve_extra_installed()  # exits 1 when smg or the servicer module is missing
    for key, value in standin_env(record=str(tmp_path / "record.jsonl")).items():
        monkeypatch.setenv(key, value)
    port = free_port()
    engine_args = ["--model", str(tiny_model), "--max-model-len", "1024"]
    assert _proc.engine_argv(engine_args, host="127.0.0.1", port=port)[2] == (
        "smg_grpc_servicer.tokenspeed"
    )

    async def run() -> int:
        engine = await _proc.spawn_engine(engine_args, host="127.0.0.1", port=port)
        try:
            await _proc.wait_grpc_serving(f"127.0.0.1:{port}", timeout=180.0)
            status = await asyncio.to_thread(_health, f"127.0.0.1:{port}", SERVICE)
            assert status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await _proc.terminate_then_kill(engine, drain_timeout=30)
        return int(engine.returncode or 0)

    assert asyncio.run(run()) == 0

"""The serve() lifecycle on a real process: signals, health transitions, drain, exit codes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.testing import FakeEngine, FakeEngineServicer, mlx_generate, running_server
from smg_servicer_core.testing.fake_servicer import SERVICE_NAME
from smg_servicer_core.testing.process import fake_server_command, spawn_with_port_file

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _spawn(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp_path / "port"
    return spawn_with_port_file(fake_server_command(port_file, *flags), port_file, timeout_s=20)


async def _read_all(stream: grpc.aio.UnaryStreamCall) -> list[pb.GenerateResponse]:
    out = []
    while (message := await stream.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    proc, port = _spawn(
        tmp_path, "--ready-delay-s", "1.0", "--token-delay-ms", "40", "--grace-period", "20"
    )
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def _status(health: Any, service: str = "") -> int:
    response = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    return response.status


async def _wait_status(health: Any, want: int, service: str = "") -> None:
    for _ in range(200):
        if await _status(health, service) == want:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"health never became {want}")


@pytest.mark.contract
async def test_sigterm_drains_in_flight_and_refuses_new_calls(slow_server) -> None:
    proc, port = slow_server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        stub = mlx_engine_pb2_grpc.MlxEngineStub(channel)
        # NOT_SERVING while the engine starts, for the process and the engine service.
        assert await _status(health) == NOT_SERVING
        assert await _status(health, SERVICE_NAME) == NOT_SERVING
        await _wait_status(health, SERVING)
        assert await _status(health, SERVICE_NAME) == SERVING

        stream = stub.Generate(mlx_generate([3, 4, 5], stream=True, max_tokens=30))
        first = await stream.read()
        assert first.HasField("chunk")
        proc.send_signal(signal.SIGTERM)
        await _wait_status(health, NOT_SERVING)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        rest = await _read_all(stream)
        assert rest[-1].HasField("complete")
        assert rest[-1].complete.completion_tokens == 30
        assert sum(len(r.chunk.token_ids) for r in [first, *rest[:-1]]) == 30
    assert await asyncio.to_thread(proc.wait, 20) == 0


@pytest.mark.contract
def test_sigint_with_nothing_in_flight_exits_zero(tmp_path: Path) -> None:
    proc, _ = _spawn(tmp_path)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0


@pytest.mark.contract
@pytest.mark.parametrize(
    "flags", [("--port", "70000"), ("--grace-period", "-1"), ("--log-level", "loud")]
)
def test_configuration_error_exits_two_with_one_line(flags: tuple[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "smg_servicer_core.testing", *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "SMG_SERVICER_HOST": "127.0.0.1"},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "configuration error" in lines[0] and flags[0] in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.contract
def test_port_in_use_is_a_configuration_error(tmp_path: Path) -> None:
    proc, port = _spawn(tmp_path)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "smg_servicer_core.testing",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 2
        assert "cannot bind" in result.stderr
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.contract
async def test_engine_death_exits_one_and_cuts_streams() -> None:
    engine = FakeEngine()
    health = HealthFrame(SERVICE_NAME)
    servicer = FakeEngineServicer(engine, health)
    from smg_servicer_core.testing import FakeScript

    engine.default_script = FakeScript(token_delay_s=0.05)
    async with running_server([servicer.binding()], health, engine) as srv:
        stub = mlx_engine_pb2_grpc.MlxEngineStub(srv.channel)
        stream = stub.Generate(mlx_generate([1, 2], stream=True, max_tokens=100))
        await stream.read()
        engine.kill("scheduler process exited")
        with pytest.raises(grpc.aio.AioRpcError):
            await _read_all(stream)
        code = await asyncio.wait_for(asyncio.shield(srv.task), 10)
    assert code == 1
    assert await health.status() == NOT_SERVING
    assert engine.shutdown_calls == 1


@pytest.mark.contract
async def test_start_up_heap_is_frozen_once_the_engine_is_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from smg_servicer_core import server as server_module

    engine = FakeEngine(ready_delay_s=0.2)
    health = HealthFrame(SERVICE_NAME)
    seen: list[tuple[bool, bool]] = []

    def record() -> int:
        seen.append((engine.ready, health.ready))
        return 0

    monkeypatch.setattr(server_module, "freeze_startup_heap", record)
    servicer = FakeEngineServicer(engine, health)
    async with running_server([servicer.binding()], health, engine) as srv:
        stub: Any = health_pb2_grpc.HealthStub(srv.channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest())

        async def serving() -> None:
            async for update in watch:
                if update.status == SERVING:
                    return

        await asyncio.wait_for(serving(), 10)
        watch.cancel()
    # once, after the engine was ready and before the server said SERVING
    assert seen == [(True, False)]


@pytest.mark.unit
def test_freeze_startup_heap_freezes_once_per_process() -> None:
    code = (
        "import gc\n"
        "from smg_servicer_core.gcheap import freeze_startup_heap\n"
        "before = gc.get_freeze_count()\n"
        "first = freeze_startup_heap()\n"
        "junk = [[i] for i in range(1000)]\n"
        "second = freeze_startup_heap()\n"
        "print(before, first, second, gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    before, first, second, after = map(int, out.stdout.split())
    assert before < 1000  # 0 before 3.12; 3.12's interpreter starts with a few hundred frozen
    assert first - before > 1000  # the interpreter's and the imports' objects
    assert second == first == after  # the second call froze nothing more


@pytest.mark.contract
def test_a_second_sigterm_during_engine_shutdown_is_ignored(tmp_path: Path) -> None:
    """The engine's shutdown runs under the server's signal handlers: a repeated SIGTERM (an
    impatient supervisor) is logged and ignored instead of killing the process mid-shutdown,
    which left an engine's worker processes behind (TokenSpeed's ranks, seen in CI as -15)."""
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc, _ = spawn_with_port_file(
            fake_server_command(tmp_path / "port", "--shutdown-delay-s", "1.5",
                                "--log-level", "info"),
            tmp_path / "port",
            timeout_s=20,
            output=out,
        )  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while b"fake engine shutting down" not in log.read_bytes():
            assert time.monotonic() < deadline, log.read_text()
            assert proc.poll() is None, log.read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    text = log.read_text()
    assert "SIGTERM again: already stopping" in text
    assert "stopped (exit 0)" in text

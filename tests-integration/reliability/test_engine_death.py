"""Engine death under load: the engine's own process (vLLM's EngineCore, SGLang's scheduler,
TokenSpeed's scheduler) is SIGKILLed while eight streams are in flight. Every stream ends with
UNAVAILABLE, health says NOT_SERVING, the worker exits 1 and leaves no process behind.

How fast the streams end is a timing figure (``death_detection_s``, 0.05-0.3 s in healthy runs):
the benchmark command (``bash tools/bench/reliability.sh``, then ``tools/reliability_report.py
--check --bench``) holds it to 1 s. The gate asserts only :data:`DETECTION_BOUND_S`, 10 s: far above
any healthy run (a missed death is never noticed, or after a health-check period: 30-60 s), so a
busy machine cannot trip it.

MLX has no engine process: it generates on a thread of the worker's own process, so its engine's
death is that thread ending while the process lives, as a failing MLX array operation ends it.
The test injects exactly that at the engine's boundary (:mod:`smg_it.mlx_dying_engine`: mlx-lm's
decoding step raises once a file appears) and checks the same as for the others.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.reliability import ENGINES, Target, engine_processes, record, running, service_name
from smg_servicer_core.testing.requests import Wire

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

STREAMS = 8
DETECTION_BOUND_S = 10.0
#: The exit status after the engine's death. vLLM: its own gRPC launcher exits 0 after any stop
#: (it waits for a signal and returns from ``main``); our servicer's death watch stops it within
#: a second of the engine's death, but cannot choose its status.
EXIT = {"mlx": 1, "vllm": 0, "sglang": 1, "tokenspeed": 1}


async def _stream(
    target: Target, stub: object, index: int, started: asyncio.Event, count: list[int]
) -> tuple[str, float]:
    request = target.request([1, 2, 3, index + 4], max_tokens=900, stream=True, ignore_eos=True)
    call = stub.Generate(request, timeout=120)  # type: ignore[attr-defined]
    try:
        first = True
        while await call.read() is not grpc.aio.EOF:
            if first:
                first = False
                count[0] += 1
                if count[0] == STREAMS:
                    started.set()
        return "OK", time.monotonic()
    except grpc.aio.AioRpcError as err:
        return err.code().name, time.monotonic()


async def _health(target: Target) -> str:
    """What a probe sees right after the streams ended."""
    async with grpc.aio.insecure_channel(target.address) as channel:
        try:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # pyright: ignore[reportUnknownMemberType]
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=service_name(target.engine)), timeout=5
            )
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.aio.AioRpcError as err:
            return err.code().name


@pytest.mark.parametrize("victim", ENGINES)
async def test_engine_death_ends_every_stream_at_once(
    victim: Wire, tiny_model: Path, tmp_path: Path
) -> None:
    fault = tmp_path / "die"  # MLX's engine dies when this file appears
    with running(victim, tiny_model, mlx_fault=fault if victim == "mlx" else None) as target:
        root = psutil.Process(target.pid)
        everything = [root, *root.children(recursive=True)]
        engine = engine_processes(victim, target.pid)
        assert victim == "mlx" or engine, f"no {victim} engine process under {target.pid}"
        started = asyncio.Event()
        count = [0]
        async with grpc.aio.insecure_channel(target.address) as channel:
            stub = target.stub(channel)
            tasks = [
                asyncio.create_task(_stream(target, stub, i, started, count))
                for i in range(STREAMS)
            ]
            await asyncio.wait_for(started.wait(), 60)
            killed_at = time.monotonic()
            for proc in engine:
                proc.send_signal(signal.SIGKILL)
            if victim == "mlx":
                fault.touch()
            endings = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        health = await _health(target)
        detection = max(at for _, at in endings) - killed_at
        record(
            victim,
            death_detection_s=round(detection, 3),
            death_codes=sorted({c for c, _ in endings}),
            death_health=health,
        )
        assert target.worker.proc is not None
        code = target.worker.proc.wait(30)
        _, alive = psutil.wait_procs(everything, timeout=15)
        record(victim, death_exit=code, death_left=len(alive))
    assert {c for c, _ in endings} == {"UNAVAILABLE"}, endings
    assert detection <= DETECTION_BOUND_S, f"the streams ended {detection:.2f}s after the kill"
    # Not serving, in whichever form the dying worker gives it: NOT_SERVING while it still
    # answers, UNAVAILABLE once it refuses, CANCELLED for a probe that lands while the server
    # stops (an engine's death stops it with no grace: core's server.drain(0)). Never SERVING.
    assert health in ("NOT_SERVING", "UNAVAILABLE", "CANCELLED"), health
    assert code == EXIT[victim], target.worker.log.read_text()[-3000:]
    assert not alive, f"left running: {[p.pid for p in alive]}"

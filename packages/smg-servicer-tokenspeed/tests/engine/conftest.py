"""Fixtures for the TokenSpeed servicer tests on TokenSpeed's real front end (``AsyncLLM``,
``_launch_subprocesses``, its sockets and wire), with only the GPU scheduler stood in
(``smg_servicer_tokenspeed.testing.scheduler``). They run in the TokenSpeed CPU environment
(``tools/envs/tokenspeed-cpu/install.sh``; ``tools/test.sh`` runs them).

``ts_server`` is ``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns), started
once per session on the tiny model; ``record`` is the JSON-lines file where the stand-in writes
every message it receives.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from smg_it.harness import free_port, stop_tree
from smg_it.tokenspeed_suite import SECRET, Record, start_ts
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.process import WorkerProcess


@pytest.fixture(scope="session")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    return Record(tmp_path_factory.mktemp("standin") / "record.jsonl")


@pytest.fixture(scope="session")
def control_port() -> int:
    """The session worker's TokenSpeed RL control app (``--rl-control-port``: pause, resume)."""
    return free_port()


@pytest.fixture(scope="session")
def ts_server(tiny_model: Path, record: Record, control_port: int) -> Iterator[WorkerProcess]:
    metrics_port = free_port()
    kv_config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{free_port()}",
    }
    server = start_ts(
        tiny_model,
        record.path,
        "--enable-output-logprobs",
        "--reasoning-parser", "qwen3",
        "--rl-control-api-key", SECRET,
        "--rl-control-port", str(control_port),
        "--kv-events-config", json.dumps(kv_config),
        env={"SMG_TOKENSPEED_SERVICER_METRICS_PORT": str(metrics_port)},
        step_ms=2,
        refuse={"refuse-400": 400, "refuse-503": 503, "refuse-500": 500},
    )  # fmt: skip
    server.metrics_port = metrics_port
    try:
        server.wait_serving()
        yield server
        drained = drain_on_sigterm(server)
    finally:
        code, alive = stop_tree(server)
    # SIGTERM mid-stream: the stream completed, new calls were refused, exit 0, nothing left.
    assert drained == (DRAIN_TOKENS, "length"), drained
    assert code == 0, server.tail()
    assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"


DRAIN_TOKENS = 300


def drain_on_sigterm(server: WorkerProcess) -> tuple[int, str]:
    """Start a stream, SIGTERM the worker, read the stream to its end: (tokens, finish)."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TokenSpeedSchedulerStub(channel)
        req = pb.GenerateRequest(
            request_id="drain",
            tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=pb.SamplingParams(max_new_tokens=DRAIN_TOKENS),
            stream=True,
        )
        stream = stub.Generate(req, timeout=60)
        messages = [next(stream)]
        server.proc.send_signal(signal.SIGTERM)
        messages.extend(stream)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
        # Refused, not served: UNAVAILABLE from the drain gate, or CANCELLED when the call lands
        # as the server stops (the stream above was the last in flight, so the drain had ended;
        # seen once in the gate under load).
        code = refused.value.code()  # pyright: ignore[reportAttributeAccessIssue]
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), code
    tokens = sum(len(m.chunk.token_ids) for m in messages if m.HasField("chunk"))
    return tokens, messages[-1].complete.finish_reason

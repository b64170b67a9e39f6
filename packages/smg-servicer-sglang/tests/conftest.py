"""Fixtures for the SGLang servicer tests, which run in the SGLang test environment
(``tools/envs/sglang-cpu/install.sh``; ``tools/test.sh`` runs them).

``sglang_server`` is SGLang's own launcher (``sglang serve --grpc-mode``, the seed's spelling of
``--smg-grpc-mode``) with our servicer behind it, started once per session on the float32 tiny
model, and ended by SIGTERM with a stream in flight: the stream completes, exit 0, nothing
left. ``kv_server`` publishes KV events from a small pool; ``test_lifecycle`` ends it by
killing its scheduler. ``reference`` is what ``sglang.Engine`` itself produces for the same
requests (computed in a subprocess). Each SGLang start costs 20-60 s here: a check that needs a
server of a shape one of these has takes that one.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from smg_it.harness import free_port, stop_tree
from smg_it.sglang_suite import Server, run_reference, start_server
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc


@pytest.fixture(scope="session")
def sglang_server(tiny_model: Path) -> Iterator[Server]:
    # A random model pads free JSON whitespace forever; the engine option keeps constrained
    # output tight (the same as vLLM's disable_any_whitespace in its tests).
    metrics_port = free_port()
    server = start_server(
        tiny_model,
        "--constrained-json-disable-any-whitespace",
        env={"SMG_SGLANG_SERVICER_METRICS_PORT": str(metrics_port)},
        mode_flag="--grpc-mode",
    )
    server.metrics_port = metrics_port
    drained: tuple[int, str] | None = None
    try:
        server.wait_serving()
        yield server
        drained = drain_on_sigterm(server)
    finally:
        code, alive = stop_tree(server)
    # SIGTERM with a stream in flight: the stream completed during the drain, exit 0, no
    # scheduler left behind.
    assert drained == (DRAIN_TOKENS, "length"), drained
    assert code == 0, server.tail()
    assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"


DRAIN_TOKENS = 200


def drain_on_sigterm(server: Server) -> tuple[int, str]:
    """Start a stream, SIGTERM the worker after its first chunk, read the stream to its end:
    (tokens, finish reason)."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        req = pb.GenerateRequest(
            request_id="drain",
            tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=pb.SamplingParams(max_new_tokens=DRAIN_TOKENS, ignore_eos=True),
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
    return tokens, rest[-1].complete.finish_reason


@pytest.fixture(scope="session")
def kv_server(tiny_model: Path) -> Iterator[Server]:
    """KV events on, and a small KV pool (2,048 tokens) so that new prompts evict old blocks
    (BlockRemoved). ``test_lifecycle`` kills its scheduler once the KV tests are done (it then
    checks the exit itself); otherwise SIGTERM stops it cleanly."""
    config = {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{free_port()}",
    }
    server = start_server(
        tiny_model,
        "--kv-events-config", json.dumps(config),
        "--max-total-tokens", "2048",
        env={"SMG_SGLANG_SERVICER_WARMUP": "off"},
    )  # fmt: skip
    try:
        server.wait_serving()
        yield server
    finally:
        ended = server.proc.poll() is not None  # its scheduler was killed (test_lifecycle)
        code = server.stop()
    assert ended or code == 0, server.tail()


@pytest.fixture(scope="session")
def reference(tiny_model: Path) -> Any:
    """``sglang.Engine``'s own outputs for :data:`smg_it.sglang_reference.CASES`."""
    return run_reference(tiny_model)

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


async def info_mismatches(
    server: Server, model: Path, *, total_tokens: int, embedding: bool = False
) -> list[str]:
    """Every field of ``GetServerInfo`` and ``GetModelInfo`` walked against what SGLang itself
    says (issue #40): its own version and defaults, the model's config as SGLang reads it
    (transformers' ``AutoConfig``) and the flags the server was started with (1,024-token
    context; ``total_tokens`` in the KV pool; ``--is-embedding``). Asked while one request runs
    (a generation model) so that the running count is one. Run on servers started different
    ways (the session's, the KV tests' small pool, the embedding model), a hard-coded field
    cannot follow them all."""
    import time
    from importlib.metadata import version

    import grpc.aio
    import psutil
    from transformers import AutoConfig

    from smg_servicer_core.testing.fields import UNSET, Satisfies, mismatches, value

    hf: Any = AutoConfig.from_pretrained(str(model))
    born = psutil.Process(server.proc.pid).create_time()
    now = time.time() + 1
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        call = None
        if not embedding:
            call = stub.Generate(
                pb.GenerateRequest(
                    request_id=f"info-walk-{total_tokens}",
                    tokenized=pb.TokenizedInput(input_ids=[1, 5, 9]),
                    sampling_params=pb.SamplingParams(max_new_tokens=500, ignore_eos=True),
                    stream=True,
                )
            )
            assert (await call.read()).HasField("chunk")
        try:
            info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        finally:
            if call is not None:
                call.cancel()
        model_info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    resolved = value(info, "server_args")  # SGLang's own resolved arguments
    server_expected = {
        "server_args": Satisfies(
            lambda d: (
                (d["model_path"], d["context_length"], d["max_total_tokens"])
                == (str(model), 1024, total_tokens)
            ),
            "SGLang's resolved arguments for this server",
        ),
        "scheduler_info": Satisfies(
            lambda d: d.get("max_total_num_tokens") == total_tokens,
            "the scheduler's own report of its KV pool",
        ),
        "active_requests": 0 if embedding else 1,
        "is_paused": UNSET,  # SGLang's pause is its HTTP server's: not run in gRPC mode
        "last_receive_timestamp": Satisfies(lambda t: born < t <= now, "a time since the start"),
        "uptime_seconds": Satisfies(lambda s: 0 < s <= now - born, "the seconds since the start"),
        "sglang_version": version("sglang"),
        "server_type": "grpc",  # the wire's name for this servicer (the proto's comment)
        "start_time": Satisfies(lambda t: born - 1 <= t <= now, "the worker's start"),
        "max_total_num_tokens": total_tokens,
    }
    eos = hf.eos_token_id
    model_expected = {
        "model_path": str(model),
        "tokenizer_path": str(model),  # no --tokenizer-path: SGLang takes the model's
        "is_generation": not embedding,
        "preferred_sampling_params": UNSET,  # none given
        "weight_version": resolved["weight_version"],  # SGLang's default: none given
        "served_model_name": str(model),  # none given: SGLang names it by its path
        "max_context_length": 1024,  # --context-length (the model's own is 2,048)
        "vocab_size": hf.vocab_size,
        "supports_vision": UNSET,  # a text model (test_images: a vision model says true)
        "model_type": hf.model_type,
        "eos_token_ids": sorted([eos] if isinstance(eos, int) else eos),
        "pad_token_id": hf.pad_token_id or UNSET,
        "bos_token_id": hf.bos_token_id or UNSET,
        "max_req_input_len": Satisfies(lambda n: 0 < n < 1024, "the scheduler's prompt bound"),
        "architectures": list(hf.architectures),
        "id2label_json": json.dumps({str(k): v for k, v in hf.id2label.items()}),
        "num_labels": hf.num_labels,
        "default_sampling_params_json": UNSET,  # the model ships no sampling defaults
    }
    return [f"server: {p}" for p in mismatches(info, server_expected)] + [
        f"model: {p}" for p in mismatches(model_info, model_expected)
    ]


@pytest.fixture(scope="session")
def walk_info() -> Any:
    """``await walk_info(server, model, total_tokens=..., embedding=...)``: the mismatches."""
    return info_mismatches

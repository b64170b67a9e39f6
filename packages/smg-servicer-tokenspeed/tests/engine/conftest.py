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
from typing import Any

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


def info_mismatches(server: WorkerProcess, model: Path, *, running: bool) -> list[str]:
    """Every field of ``GetServerInfo`` and ``GetModelInfo`` walked against what TokenSpeed
    itself says (issue #40): its version, its resolved arguments (``server_args``), the
    scheduler's ready report (``scheduler_info``: the stand-in's, as the GPU scheduler's would
    be), the model's config as transformers reads it, and the flags (``--max-model-len 1024``).
    With ``running``, asked while one request runs (its count is then one). Run on the session
    worker (a text model) and the encode worker (a multimodal one), a hard-coded field cannot
    follow both."""
    import time
    from importlib.metadata import version

    import psutil
    from transformers import AutoConfig

    from smg_servicer_core.testing.fields import UNSET, Satisfies, mismatches, value

    config: Any = AutoConfig.from_pretrained(str(model))
    text: Any = getattr(config, "text_config", None) or config
    born = psutil.Process(server.proc.pid).create_time()
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TokenSpeedSchedulerStub(channel)
        stream = None
        if running:
            stream = stub.Generate(
                pb.GenerateRequest(
                    request_id="info-walk",
                    tokenized=pb.TokenizedInput(input_ids=[1, 5, 9]),
                    sampling_params=pb.SamplingParams(max_new_tokens=900, ignore_eos=True),
                    stream=True,
                ),
                timeout=60,
            )
            assert next(stream).HasField("chunk")
        try:
            info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
        finally:
            if stream is not None:
                stream.cancel()
        model_info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    now = time.time() + 1
    args, ready = value(info, "server_args"), value(info, "scheduler_info")
    dtype = str(ready.get("multimodal_encoder_dtype") or "")
    eos = text.eos_token_id  # else the tokenizer's, as TokenSpeed's model config takes it
    if eos is None:
        from transformers import AutoTokenizer

        eos = AutoTokenizer.from_pretrained(str(model)).eos_token_id
    server_expected = {
        "server_args": Satisfies(
            lambda d: (d["model"], d["max_model_len"]) == (str(model), 1024),
            "TokenSpeed's resolved arguments for this worker",
        ),
        "scheduler_info": Satisfies(
            lambda d: d.get("max_model_len") == 1024, "the scheduler's ready report"
        ),
        "active_requests": 1 if running else 0,
        "is_paused": UNSET,  # its own pause: test_is_paused_follows_tokenspeeds_own_pause...
        "uptime_seconds": Satisfies(lambda s: 0 < s <= now - born, "the seconds since the start"),
        "max_total_num_tokens": ready["max_total_num_tokens"] or UNSET,
        "tokenspeed_version": version("tokenspeed"),
        "start_time": Satisfies(lambda t: born - 1 <= t <= now, "the worker's start"),
        "constrained_decoding": UNSET,  # TokenSpeed 0.1.1 declares none
    }
    multimodal = getattr(config, "vision_config", None) is not None  # a vision tower
    model_expected = {
        "model_path": str(model),
        "tokenizer_path": str(args.get("tokenizer") or model),
        "served_model_name": str(args.get("served_model_name") or model),
        "model_type": config.model_type,
        "architectures": list(config.architectures),
        "max_context_length": 1024,  # --max-model-len
        "max_req_input_len": ready["max_req_input_len"],
        "vocab_size": text.vocab_size,
        "eos_token_ids": Satisfies(
            lambda ids: sorted(ids) == sorted([eos] if isinstance(eos, int) else eos),
            f"the model's eos ids {eos}",
        ),
        "pad_token_id": text.pad_token_id or UNSET,
        "bos_token_id": text.bos_token_id or UNSET,
        "weight_version": args["weight_version"],  # TokenSpeed's default: none given
        "default_sampling_params_json": UNSET,  # no --preferred-sampling-params
        "supports_vision": multimodal or UNSET,
        "supports_multimodal": multimodal or UNSET,
        "supported_modalities": Satisfies(
            lambda m: bool(m) == multimodal, "the model's modalities (images: multimodal)"
        ),
        "model_dtype": dtype if dtype in ("bfloat16", "float16", "float32") else UNSET,
        "multimodal_encoder_dtype": dtype or UNSET,
    }
    return [f"server: {p}" for p in mismatches(info, server_expected)] + [
        f"model: {p}" for p in mismatches(model_info, model_expected)
    ]


@pytest.fixture(scope="session")
def walk_info() -> Any:
    """``walk_info(server, model, running=...)``: the info fields that are not TokenSpeed's."""
    return info_mismatches

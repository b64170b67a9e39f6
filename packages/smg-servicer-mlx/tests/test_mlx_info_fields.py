"""Every field of ``GetServerInfo`` and ``GetModelInfo`` on the real mlx-lm engine, walked against
what mlx-lm itself says of the model (issue #40: a field comes from the engine or is left
unset), on two models that differ in every model fact: the tiny Llama and a tiny Qwen2 with
another context length. The expectations are read from mlx-lm's loaded model and tokenizer and
the model's own config, not from our model-info module, so a hard-coded field fails on one."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from smg_servicer_core.proto import mlx_engine_pb2 as pb
from smg_servicer_core.testing import mlx_generate
from smg_servicer_core.testing.fields import (
    UNSET,
    Satisfies,
    mismatches,
    server_info_while_running,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny model: another architecture, context length and weights."""
    from smg_servicer_core.testing.tiny_model import TinyModelSpec, cached_tiny_model

    spec = TinyModelSpec(arch="qwen2", seed=7, max_positions=512, corpus_sentences=2000)
    return cached_tiny_model(tmp_path_factory.mktemp("qwen2"), spec)


def _own(model_dir: Path) -> dict[str, Any]:
    """What mlx-lm says of the model (its loaded arguments and tokenizer) and what the model's
    config says where mlx-lm keeps nothing (architectures, pad and bos ids)."""
    from mlx_lm import load

    loaded: Any = load(str(model_dir))
    model, tokenizer = loaded[0], loaded[1]
    config = json.loads((model_dir / "config.json").read_text())
    return {
        "model_path": str(model_dir),
        "is_generation": True,  # mlx-lm runs causal LMs only: the MLX servicer serves nothing else
        "max_context_length": model.args.max_position_embeddings,
        "vocab_size": model.args.vocab_size,
        "served_model_name": str(model_dir),  # no served name given: the model's
        "model_type": model.args.model_type,
        "architectures": config["architectures"],
        "eos_token_ids": Satisfies(
            lambda ids: sorted(ids) == sorted(tokenizer.eos_token_ids),
            f"mlx-lm's eos ids {sorted(tokenizer.eos_token_ids)}",
        ),
        "pad_token_id": config.get("pad_token_id") or UNSET,
        "bos_token_id": config.get("bos_token_id") or UNSET,
        "max_req_input_len": model.args.max_position_embeddings,
    }


@pytest.mark.parametrize("which", ["llama", "qwen2"])
async def test_every_info_field_is_mlx_lms_own(
    which: str, tiny_model: Path, tiny_qwen2: Path, serve_model: Any
) -> None:
    model_dir = tiny_model if which == "llama" else tiny_qwen2
    async with serve_model(model_dir, {}) as served:
        stub, started = served.stub, served.servicer.started_wall
        running = mlx_generate([1, 5, 9], max_tokens=500, ignore_eos=True, stream=True)
        server = await server_info_while_running(stub, running, pb.GetServerInfoRequest())
        model = await stub.GetModelInfo(pb.GetModelInfoRequest())
    expected_server = {
        "server_type": "mlx-grpc",  # the wire's name for this servicer
        "active_requests": 1,
        "uptime_seconds": Satisfies(
            lambda s: 0 < s <= time.time() - started + 1, "the seconds since the worker started"
        ),
    }
    assert mismatches(server, expected_server) == []
    assert mismatches(model, _own(model_dir)) == []

"""Running TokenSpeed on a CPU for tests (imports no TokenSpeed).

:func:`serve_command` takes the interpreter of an environment that has TokenSpeed: this module holds
no path of its own (the checkout's test kit says where its TokenSpeed environment is).
:mod:`.scheduler` is the stand-in for TokenSpeed's GPU scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smg_servicer_core.config import Setting, parse_bool, setting_value

REAL_SCHEDULER = Setting(
    "real_scheduler", parse_bool, False, "run the tests on TokenSpeed's real (GPU) scheduler",
    env="SMG_TS_REAL_SCHEDULER",
)  # fmt: skip
#: The scheduler stand-in's entry (``SMG_TOKENSPEED_SCHEDULER``).
STANDIN_ENTRY = "smg_servicer_tokenspeed.testing.scheduler:run"
#: TokenSpeed flags for the float32 tiny model on a CPU (``--device`` only takes cuda/npu; on
#: this path nothing touches it).
CPU_FLAGS = ("--max-model-len", "1024", "--log-level", "warning")


def standin_env(**options: Any) -> dict[str, str]:
    """The environment that puts the scheduler stand-in in place (``options``: see
    :mod:`.scheduler`); empty with ``SMG_TS_REAL_SCHEDULER=1`` (a GPU machine runs the real one,
    ``tools/gpu/tokenspeed_check.sh``)."""
    if setting_value(REAL_SCHEDULER):
        return {}
    return {"SMG_TOKENSPEED_SCHEDULER": STANDIN_ENTRY, "SMG_TS_STANDIN": json.dumps(options)}


def serve_command(
    model: Path, port: int, *extra: str, python: Path, module: str | None = None
) -> list[str]:
    """``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns) on the tiny model,
    with ``python``: the interpreter of an environment that has TokenSpeed."""
    return [
        str(python), "-m", module or "smg_grpc_servicer.tokenspeed",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        *CPU_FLAGS, *extra,
    ]  # fmt: skip


def headless_command(model: Path, worker_url: str, *extra: str, python: Path) -> list[str]:
    """``python -m smg_grpc_servicer.tokenspeed.headless`` (the router's direct ZMQ lane) on the
    tiny model, dialing the router of the ``ipc://`` ``worker_url``."""
    return [
        str(python), "-m", "smg_grpc_servicer.tokenspeed.headless", "--zmq-worker-url", worker_url,
        "--model", str(model), *CPU_FLAGS, *extra,
    ]  # fmt: skip


#: A multimodal architecture TokenSpeed 0.1.1 knows (``is_multimodal_model``).
MULTIMODAL_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"


def tiny_multimodal(text_model: Path, dest: Path) -> Path:
    """A config-only tiny Qwen3.5 (vision + text) checkpoint in ``dest``, with ``text_model``'s
    tokenizer: enough for TokenSpeed's front end to start an encode worker (it refuses a text
    model: "disaggregation_mode=encode requires a multimodal checkpoint") while the stand-in
    runs no tower. Needs transformers (any TokenSpeed environment has it)."""
    import shutil  # noqa: PLC0415

    from transformers import Qwen3_5Config  # noqa: PLC0415  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    text = json.loads((text_model / "config.json").read_text())
    config: Any = Qwen3_5Config(
        text_config={
            "vocab_size": text["vocab_size"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 1024,
        },
        vision_config={
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    )  # fmt: skip
    config.architectures = [MULTIMODAL_ARCHITECTURE]
    dest.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(dest)
    for path in text_model.iterdir():
        if path.name.startswith("tokenizer") or path.name == "special_tokens_map.json":
            shutil.copy(path, dest / path.name)
    return dest

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


#: Qwen3.5's vision tokens, as its tokenizer spells them; an image renders as the first three.
VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
#: The tiny checkpoint's pictures: 14-pixel patches merged 2 x 2, so a 56 x 56 picture is a
#: 1 x 4 x 4 grid of 16 patches and 4 positions in the prompt.
PATCH, MERGE = 14, 2


def tiny_multimodal(dest: Path, seed: int = 0) -> Path:
    """A config-only tiny Qwen3.5 (vision + text) checkpoint in ``dest``: the tiny text model's
    tokenizer (``seed``) with Qwen3.5's vision tokens, a chat template that renders an image
    part as ``<|vision_start|><|image_pad|><|vision_end|>``, and a Qwen2-VL image processor
    config (what the router preprocesses a picture with: ``qwen3_vl``, which takes
    ``qwen3_5``). Enough for TokenSpeed's front end to start every EPD role (it refuses a text
    model: "disaggregation_mode=encode requires a multimodal checkpoint") while the stand-ins
    run no tower. Needs transformers (any TokenSpeed environment has it)."""
    from transformers import Qwen3_5Config  # noqa: PLC0415  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    from smg_servicer_core.testing.hf_vlm import chatml_template, media_tokenizer  # noqa: PLC0415

    dest.mkdir(parents=True, exist_ok=True)
    image = "".join(VISION_TOKENS[:3])
    ids = media_tokenizer(dest, seed, VISION_TOKENS, chatml_template(image))
    start, pad, end, video = (ids[t] for t in VISION_TOKENS)
    config: Any = Qwen3_5Config(
        text_config={
            "vocab_size": max(ids.values()) + 1, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 1024,
        },
        vision_config={
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": 64, "patch_size": PATCH, "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
        },
        image_token_id=pad, video_token_id=video, vision_start_token_id=start,
        vision_end_token_id=end,
    )  # fmt: skip
    config.architectures = [MULTIMODAL_ARCHITECTURE]
    config.save_pretrained(dest)
    pixels = (PATCH * MERGE) ** 2  # one merged position's pixels
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": PATCH,
        "merge_size": MERGE, "temporal_patch_size": 2, "min_pixels": pixels,
        "max_pixels": 4 * pixels, "size": {"shortest_edge": pixels, "longest_edge": 4 * pixels},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    }  # fmt: skip
    (dest / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return dest

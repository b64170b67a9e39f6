"""A generated clip through the vLLM servicer's in-process media path, without an engine
(issue #45): vLLM's media connector fetches the data URL, OpenCV decodes it, vLLM's renderer runs
the model's processor (``_mm_engine.InprocessProcessor``, as a worker does), once with no frame
cap and once with ``SMG_VLLM_MM_MAX_VIDEO_FRAMES``-style cap :data:`CAP`. Run in its own process
with the torchvision shim first on ``PYTHONPATH`` (:data:`SHIM`):
``python -m smg_it.video_render MODEL OUT.json`` -> ``{"uncapped": N, "capped": M}``: the video
token's positions in the rendered prompt."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from smg_it.paths import REPO
from smg_servicer_core.testing.media import data_url

#: The functional torchvision shim (tools/envs/vllm-cpu/shims/torchvision/__init__.py says why).
SHIM = REPO / "tools" / "envs" / "vllm-cpu" / "shims"
FRAMES = 12
CAP = 4
PROMPT = "What happens in <video> this clip?"


def clip(frames: int = FRAMES) -> bytes:
    """An mp4 (mp4v) of ``frames`` 64x48 frames at 4 fps, a bar growing across them."""
    import cv2
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "clip.mp4")
        fourcc: Any = cv2.VideoWriter_fourcc(*"mp4v")  # pyright: ignore[reportAttributeAccessIssue]
        writer = cv2.VideoWriter(path, fourcc, 4, (64, 48))
        for i in range(frames):
            frame = np.zeros((48, 64, 3), np.uint8)
            frame[:, : (i + 1) * 5] = (40 * (i % 6), 200, 255 - 20 * i)
            writer.write(frame)
        writer.release()
        return Path(path).read_bytes()


async def _positions(model: str, cap: int, url: str) -> int:
    from transformers import AutoTokenizer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from smg_servicer_vllm import _mm_engine
    from smg_servicer_vllm.mm import MediaItem
    from smg_servicer_vllm.mm_settings import MmSettings

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--model", model, "--dtype", "float32", "--max-model-len", "1024",
         "--limit-mm-per-prompt", '{"video": 1}'],
    )  # fmt: skip
    config, renderer = _mm_engine.sidecar_renderer(args)
    engine = SimpleNamespace(model_config=config.model_config, renderer=renderer)
    settings = MmSettings(processor="inprocess", max_video_frames=cap)
    processor = _mm_engine.InprocessProcessor(engine, settings)
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    video = tokenizer.convert_tokens_to_ids("<video>")
    try:
        rendered = await processor.engine_input(ids, [MediaItem("video", url)], "")
    finally:
        await processor.aclose()
    return sum(1 for t in rendered["prompt_token_ids"] if t == video)


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    url = data_url(clip(), "video/mp4")
    result = {
        "uncapped": asyncio.run(_positions(model, 0, url)),
        "capped": asyncio.run(_positions(model, CAP, url)),
    }
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()

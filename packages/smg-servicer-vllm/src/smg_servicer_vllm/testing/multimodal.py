"""Helpers of the multimodal engine tests (tiny VLM): prompts, vLLM's own reference ids, media
requests."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any, cast

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.tiny_vlm import image_token_ids

MAX_TOKENS = 8


def vlm_prompts(tiny_vlm: Path) -> dict[str, Any]:
    """Chat prompts with zero, one and two ``<image>`` anchors, plus the image token ids."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers, an engine dependency

    tokenizer = cast(Any, AutoTokenizer).from_pretrained(str(tiny_vlm))

    def chat(text: str) -> list[int]:
        return list(
            tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        )

    return {
        "one": chat("<image>describe this"),
        "two": chat("<image> and <image>: which?"),
        "none": chat("no image here"),
        **image_token_ids(tiny_vlm),
    }


def pil(content: bytes) -> Any:
    from PIL import Image  # noqa: PLC0415 - PIL, an engine dependency

    return Image.open(io.BytesIO(content)).convert("RGB")


async def reference(
    llm: Any, ids: list[int], images: list[bytes], max_tokens: int = MAX_TOKENS
) -> tuple[list[int], int]:
    """vLLM in-process, the same PIL images, no servicer: (greedy ids, prompt length)."""
    from smg_servicer_vllm import _engine  # noqa: PLC0415 - vLLM, only for the reference

    data = [pil(i) for i in images]
    prompt = {
        "prompt_token_ids": ids,
        "multi_modal_data": {"image": data[0] if len(data) == 1 else data},
    }
    final: Any = None
    async for output in llm.generate(
        prompt,
        _engine.greedy_params(max_tokens),
        f"ref-{time.monotonic_ns()}",
    ):
        final = output
    return list(final.outputs[0].token_ids), len(final.prompt_token_ids)


def media_request(ids: list[int], *urls: str, **kwargs: Any) -> pb.GenerateRequest:
    """A greedy ``MAX_TOKENS`` request with one image media ref per URL."""
    request = generate_request(
        "vllm", ids, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kwargs
    )
    for url in urls:
        request.media_refs.items.add(modality=common_pb2.IMAGE, url=url)
    return request


async def complete(stub: Any, request: pb.GenerateRequest) -> pb.GenerateComplete:
    responses = [r async for r in stub.Generate(request)]
    return responses[-1].complete

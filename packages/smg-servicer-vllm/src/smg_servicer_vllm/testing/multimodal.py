"""Helpers of the multimodal engine tests (the tiny image, video and audio models): prompts,
vLLM's own reference ids, media-ref and tensor requests."""

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
MODALITIES = {"image": common_pb2.IMAGE, "video": common_pb2.VIDEO, "audio": common_pb2.AUDIO}


def chat_ids(model: Path, *texts: str, tokens: tuple[str, ...] = ()) -> dict[str, Any]:
    """Each text as one ChatML user turn's ids (the tiny models' template), and each of
    ``tokens``' id."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - transformers, an engine dependency

    tokenizer = cast(Any, AutoTokenizer).from_pretrained(str(model))
    turn = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    ids: dict[str, Any] = {text: list(tokenizer.encode(turn.format(text))) for text in texts}
    return ids | {token: int(tokenizer.convert_tokens_to_ids(token)) for token in tokens}


def vlm_prompts(tiny_vlm: Path) -> dict[str, Any]:
    """Chat prompts with zero, one and two ``<image>`` anchors, plus the image token ids."""
    texts = ("<image>describe this", "<image> and <image>: which?", "no image here")
    chat = chat_ids(tiny_vlm, *texts)
    return {
        "one": chat[texts[0]],
        "two": chat[texts[1]],
        "none": chat[texts[2]],
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


def media_request(
    ids: list[int], *urls: str, modality: str = "image", **kwargs: Any
) -> pb.GenerateRequest:
    """A greedy ``MAX_TOKENS`` request with one media ref of ``modality`` per URL."""
    request = generate_request(
        "vllm", ids, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kwargs
    )
    for url in urls:
        request.media_refs.items.add(modality=MODALITIES[modality], url=url)
    return request


async def item_reference(
    llm: Any, ids: list[int], modality: str = "", item: Any = None
) -> tuple[list[int], int]:
    """vLLM in-process, no servicer, one ``item`` of ``modality`` as vLLM's offline API takes
    it (a clip's (frames, metadata), a sound's (samples, rate)) or none: (greedy ids, prompt
    length)."""
    from smg_servicer_vllm import _engine  # noqa: PLC0415 - vLLM, only for the reference

    prompt: dict[str, Any] = {"prompt_token_ids": ids}
    if item is not None:
        prompt["multi_modal_data"] = {modality: [item]}
    final: Any = None
    async for output in llm.generate(
        prompt, _engine.greedy_params(MAX_TOKENS), f"ref-{time.monotonic_ns()}"
    ):
        final = output
    return list(final.outputs[0].token_ids), len(final.prompt_token_ids)


def put_inline(message: Any, tensor: Any) -> None:
    """``tensor`` (torch, of a dtype numpy has: not bfloat16) into a ``TensorData`` as inline
    bytes."""
    array = tensor.contiguous()
    message.shape[:] = list(array.shape)
    message.dtype = str(array.dtype).removeprefix("torch.")
    message.inline = array.numpy().tobytes()


async def item_tensor_request(
    llm: Any, ids: list[int], modality: str, item: Any, *, token: int, encoder_key: str
) -> pb.GenerateRequest:
    """What a router sends for vLLM's own processing of one ``item``: the expanded ids, each of
    the item's tensors batched (``[1, ...]``; ``encoder_key``'s as ``pixel_values``, the others
    as model-specific tensors), its placeholder and hash."""
    prompt = {"prompt_token_ids": ids, "multi_modal_data": {modality: [item]}}
    engine_input = await llm.renderer.process_for_engine_async(
        prompt, time.time(), skip_mm_cache=True
    )
    request = media_request(list(engine_input["prompt_token_ids"]))
    batch = request.mm_inputs
    batch.modality = MODALITIES[modality]
    batch.im_token_id = token
    if encoder_key not in ("pixel_values", "pixel_values_videos"):  # the servicer's defaults
        batch.encoder_input_key = encoder_key
    (processed,) = engine_input["mm_kwargs"][modality]
    for key in processed:
        stacked = processed[key].data.unsqueeze(0)
        target = batch.pixel_values if key == encoder_key else batch.model_specific_tensors[key]
        put_inline(target, stacked)
        batch.batched_keys.append(key)
    for placeholder in engine_input["mm_placeholders"][modality]:
        batch.mm_placeholders.add(offset=placeholder.offset, length=placeholder.length)
    batch.mm_hashes.extend(engine_input["mm_hashes"][modality])
    return request


async def complete(stub: Any, request: pb.GenerateRequest) -> pb.GenerateComplete:
    responses = [r async for r in stub.Generate(request)]
    return responses[-1].complete

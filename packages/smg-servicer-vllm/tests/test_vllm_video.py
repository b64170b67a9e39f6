"""Video on the real vLLM 0.32 CPU engine (issue #45): a tiny float32 LLaVA-NeXT-Video
(``smg_servicer_core.testing.tiny_video_vlm``) serving a clip generated here (OpenCV, mp4v), in
the video environment (tools/envs/list: the workspace's, the functional torchvision shim first on
``PYTHONPATH``; transformers' video processors need torchvision).

The same clip three ways gives the greedy ids of vLLM's own generation (``AsyncLLM.generate`` of
the clip as vLLM's loader decodes it, no servicer): router-preprocessed tensors, a media ref
processed in the worker, a media ref processed by the Redis sidecar. The frame cap
(``SMG_VLLM_MM_MAX_VIDEO_FRAMES``) samples a longer clip down (the prompt's placeholder count
shows it, and the ids are vLLM's with the same cap); a clip over the byte cap is refused before
any fetch; a clip shorter than the longest the model takes is served as tensors; a seeded fuzz of
broken video tensors gets answers or INVALID_ARGUMENT, the engine healthy after each."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from smg_it.fuzz_items import each_fault_is_refused, fuzz
from smg_it.paths import model_cache
from smg_it.video import clip, shim_missing
from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing.media import data_url
from smg_servicer_core.testing.tiny_video_vlm import TinyVideoVlmSpec, cached_tiny_video_vlm
from smg_servicer_vllm.mm import media_items
from smg_servicer_vllm.mm_settings import MmSettings, resolve_mm_settings
from smg_servicer_vllm.testing.multimodal import (
    chat_ids,
    complete,
    item_reference,
    item_tensor_request,
    media_request,
)

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

PER_FRAME = TinyVideoVlmSpec().embeddings_per_frame
FRAMES, CAP, SHORT = 12, 4, 5
CLIP, OTHER = clip(FRAMES), clip(FRAMES, seed=1)
LIMIT = '{"video": 1}'


@pytest.fixture(scope="module")
def media_model() -> Path:
    if (why := shim_missing()) is not None:
        pytest.fail(why)
    return cached_tiny_video_vlm(model_cache())


@pytest.fixture(scope="module")
def media_limits() -> dict[str, int]:
    return {"video": 1}


@pytest.fixture(scope="module")
def ids(media_model: Path) -> dict[str, Any]:
    chat = chat_ids(media_model, "<video>what happens?", "what happens?", tokens=("<video>",))
    return {
        "video": chat["<video>what happens?"],
        "none": chat["what happens?"],
        "<video>": chat["<video>"],
    }


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def capped(media_llm: Any, serve_llm: Any) -> AsyncIterator[Any]:
    """The cap as an operator sets it: the environment variable, through the launcher's parse."""
    environ = {"SMG_VLLM_MM_PROCESSOR": "inprocess", "SMG_VLLM_MM_MAX_VIDEO_FRAMES": str(CAP)}
    settings = resolve_mm_settings(None, environ)
    assert settings.max_video_frames == CAP
    async with serve_llm(media_llm, settings) as stack:
        yield stack[1]


def decoded(content: bytes, frames: int = 0) -> Any:
    """The clip as vLLM's own loader decodes it (``--media-io-kwargs`` num_frames ``frames``):
    the (frames, metadata) pair vLLM's offline API takes."""
    from vllm.multimodal.media.connector import MediaConnector

    kwargs = {"video": {"num_frames": frames}} if frames else None
    return MediaConnector(media_io_kwargs=kwargs).fetch_video(data_url(content, "video/mp4")).media


async def tensor_request(llm: Any, ids: list[int], video: Any, token: int) -> pb.GenerateRequest:
    """The clip's ``pixel_values_videos`` (``[1, frames, 3, size, size]``, batched)."""
    return await item_tensor_request(
        llm, ids, "video", video, token=token, encoder_key="pixel_values_videos"
    )


def ref_request(ids: list[int], content: bytes) -> pb.GenerateRequest:
    return media_request(ids, data_url(content, "video/mp4"), modality="video")


async def reference(llm: Any, ids: list[int], video: Any = None) -> tuple[list[int], int]:
    return await item_reference(llm, ids, "video", video)


def positions(request: pb.GenerateRequest, token: int) -> int:
    return sum(1 for t in request.tokenized.input_ids if t == token)


# The clip three ways -------------------------------------------------------------------------


async def test_a_media_ref_gives_vllms_own_ids_for_the_clip(media_worker, media_llm, ids) -> None:
    want, prompt_len = await reference(media_llm, ids["video"], decoded(CLIP))
    got = await complete(media_worker, ref_request(ids["video"], CLIP))
    assert list(got.output_ids) == want
    # every frame fills its positions: the anchor became FRAMES x PER_FRAME video tokens
    assert got.prompt_tokens == prompt_len == len(ids["video"]) - 1 + FRAMES * PER_FRAME
    # the clip moves the answer: without it, and with another clip, the ids differ
    assert (await reference(media_llm, ids["none"]))[0] != want
    other = await complete(media_worker, ref_request(ids["video"], OTHER))
    assert list(other.output_ids) == (await reference(media_llm, ids["video"], decoded(OTHER)))[0]
    assert list(other.output_ids) != want


async def test_preprocessed_tensors_give_the_same_ids(media_worker, media_llm, ids) -> None:
    video = decoded(CLIP)
    want, prompt_len = await reference(media_llm, ids["video"], video)
    request = await tensor_request(media_llm, ids["video"], video, ids["<video>"])
    assert positions(request, ids["<video>"]) == FRAMES * PER_FRAME
    got = await complete(media_worker, request)
    assert list(got.output_ids) == want
    assert got.prompt_tokens == prompt_len


async def test_a_clip_shorter_than_the_longest_is_served_as_tensors(
    media_worker, media_llm, ids
) -> None:
    # The layout is learnt from clips of several lengths: one length alone refused every other.
    short = decoded(clip(SHORT, seed=2))
    want, _ = await reference(media_llm, ids["video"], short)
    request = await tensor_request(media_llm, ids["video"], short, ids["<video>"])
    assert positions(request, ids["<video>"]) == SHORT * PER_FRAME
    assert list((await complete(media_worker, request)).output_ids) == want


async def test_media_refs_through_the_sidecar_give_the_same_ids(
    media_via_sidecar, media_llm, ids
) -> None:
    for content in (CLIP, OTHER):
        want, prompt_len = await reference(media_llm, ids["video"], decoded(content))
        got = await complete(media_via_sidecar, ref_request(ids["video"], content))
        assert list(got.output_ids) == want
        assert got.prompt_tokens == prompt_len


# The caps ----------------------------------------------------------------------------------------


async def test_the_frame_cap_samples_a_longer_clip_down(capped, media_llm, ids) -> None:
    want, prompt_len = await reference(media_llm, ids["video"], decoded(CLIP, CAP))
    got = await complete(capped, ref_request(ids["video"], CLIP))
    assert got.prompt_tokens == prompt_len == len(ids["video"]) - 1 + CAP * PER_FRAME
    assert list(got.output_ids) == want
    # a clip within the cap keeps every frame
    short = clip(CAP - 1, seed=3)
    within = await complete(capped, ref_request(ids["video"], short))
    assert within.prompt_tokens == len(ids["video"]) - 1 + (CAP - 1) * PER_FRAME


def test_a_clip_over_the_byte_cap_is_refused_before_any_fetch() -> None:
    url = data_url(CLIP, "video/mp4")
    request = pb.GenerateRequest(request_id="v", tokenized=pb.TokenizedInput(input_ids=[1, 7, 2]))
    request.media_refs.items.add(modality=common_pb2.VIDEO, url=url)
    settings = MmSettings(processor="inprocess", max_item_bytes=len(url) // 2)
    with pytest.raises(InvalidRequest, match=r"over the \d+-byte limit"):
        media_items(request, settings, limits={"video": 1}, schemes=("data",), anchors={"video": 7})
    big = MmSettings(processor="inprocess", max_item_bytes=len(url) * 2)
    items = media_items(request, big, limits={"video": 1}, schemes=("data",), anchors={"video": 7})
    assert [item.modality for item in items] == ["video"]


# Broken video tensors ----------------------------------------------------------------------------


def _shape(b: Any, index: int, value: int) -> None:
    b.pixel_values.shape[index] = value


def _two_videos(b: Any) -> None:
    b.pixel_values.inline = bytes(b.pixel_values.inline) * 2
    b.pixel_values.shape[0] = 2
    first = b.mm_placeholders[0]
    b.mm_placeholders.add(offset=first.offset, length=first.length)
    b.mm_hashes.append("another")


def _frame_short(b: Any) -> None:
    b.mm_placeholders[0].length -= PER_FRAME


#: name -> (what it does to a good video request's ``mm_inputs``, the text the refusal holds).
BAD: dict[str, tuple[Any, str]] = {
    "dtype": (lambda b: setattr(b.pixel_values, "dtype", "int32"), "takes a floating tensor"),
    "unknown dtype": (lambda b: setattr(b.pixel_values, "dtype", "complex64"), "complex64"),
    "bytes": (lambda b: setattr(b.pixel_values, "inline", b.pixel_values.inline[:-4]), "bytes"),
    "frame size": (lambda b: (_shape(b, 3, 28), _shape(b, 4, 112)), "this model takes"),
    "channels": (lambda b: (_shape(b, 2, 1), _shape(b, 4, 168)), "this model takes"),
    "not batched": (lambda b: b.ClearField("batched_keys"), "this model takes"),
    "a frame short": (_frame_short, "fewer than the"),
    "image modality": (
        lambda b: setattr(b, "modality", common_pb2.IMAGE),
        "does not accept image input",
    ),
    "two videos": (_two_videos, "video item(s)"),
    "no placeholder": (lambda b: b.ClearField("mm_placeholders"), "mm_placeholders is empty"),
    "outside the prompt": (lambda b: setattr(b.mm_placeholders[0], "offset", 10_000), "outside"),
    "token id": (lambda b: setattr(b, "im_token_id", 7), "no im_token_id 7"),
    "hashes": (lambda b: b.mm_hashes.append("extra"), "mm_hashes"),
    "stray tensor": (
        lambda b: b.model_specific_tensors["image_sizes"].CopyFrom(b.pixel_values),
        "this model takes",
    ),
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def good(media_llm: Any, ids: dict[str, Any]) -> tuple[pb.GenerateRequest, list[int]]:
    video = decoded(clip(3, seed=4))
    request = await tensor_request(media_llm, ids["video"], video, ids["<video>"])
    return request, (await reference(media_llm, ids["video"], video))[0]


async def test_each_broken_video_tensor_is_invalid_argument_naming_it(media_worker, good) -> None:
    request, want = good
    await each_fault_is_refused(media_worker, request, want, BAD)


async def test_fuzzed_video_tensors_get_a_client_fault_or_an_answer_and_the_engine_lives(
    media_worker, good
) -> None:
    """Seeded (``SMG_FUZZ_SEED``; ``SMG_FUZZ_VIDEO_EXAMPLES`` draws): :mod:`smg_it.fuzz_items`
    over :data:`BAD`."""
    undone_by = {
        "dtype": ("dtype", "unknown dtype"),
        "shape": ("frame size", "channels"),
        "span": ("a frame short", "outside the prompt"),
    }
    examples = int(os.environ.get("SMG_FUZZ_VIDEO_EXAMPLES", "200"))
    request, want = good
    await fuzz(media_worker, request, want, BAD, undone_by=undone_by, examples=examples)

"""Audio on the real vLLM 0.32 CPU engine (issue #45): a tiny float32 Qwen2-Audio
(``smg_servicer_core.testing.tiny_audio_lm``) serving 16 kHz WAV clips generated here.

The same clip three ways gives the greedy ids of vLLM's own generation (``AsyncLLM.generate`` of
the clip as vLLM's loader decodes it, no servicer): router-preprocessed tensors, a media ref
processed in the worker, a media ref processed by the Redis sidecar. A clip's embeddings are
counted per item by vLLM's own processor from its feature mask, so a shorter clip is served as
tensors and a placeholder that does not match the mask is refused; a clip at another sample rate
is refused (resampling needs torchaudio, which this CPU build cannot have); a seeded fuzz of
broken audio tensors gets answers or INVALID_ARGUMENT, the engine healthy after each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio

from smg_it.fuzz_items import answer, each_fault_is_refused, fuzz
from smg_it.paths import model_cache
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing.media import data_url
from smg_servicer_core.testing.tiny_audio_lm import (
    AUDIO,
    AUDIO_ANCHOR,
    SAMPLE_RATE,
    TinyAudioLmSpec,
    cached_tiny_audio_lm,
    wav,
)
from smg_servicer_vllm.testing.multimodal import (
    chat_ids,
    complete,
    item_reference,
    item_tensor_request,
    media_request,
)

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

PER_SECOND = TinyAudioLmSpec().embeddings_per_second
LIMIT = '{"audio": 1}'


def sound(seconds: float, seed: int, rate: int = SAMPLE_RATE) -> bytes:
    """``seconds`` of noise from ``seed`` as 16-bit WAV."""
    return wav(np.random.default_rng(seed).uniform(-0.5, 0.5, int(rate * seconds)), rate)


SOUND, OTHER = sound(1.0, seed=0), sound(1.0, seed=1)


@pytest.fixture(scope="module")
def media_model() -> Path:
    return cached_tiny_audio_lm(model_cache())


@pytest.fixture(scope="module")
def media_limits() -> dict[str, int]:
    return {"audio": 1}


@pytest.fixture(scope="module")
def ids(media_model: Path) -> dict[str, Any]:
    texts = (f"{AUDIO_ANCHOR}what is said?", "what is said?")
    chat = chat_ids(media_model, *texts, tokens=(AUDIO,))
    return {"audio": chat[texts[0]], "none": chat[texts[1]], AUDIO: chat[AUDIO]}


def decoded(content: bytes) -> Any:
    """The clip as vLLM's own loader decodes it: the (samples, rate) pair vLLM's offline API
    takes."""
    from vllm.multimodal.media.connector import MediaConnector

    return MediaConnector().fetch_audio(data_url(content, "audio/wav"))


async def reference(llm: Any, ids: list[int], content: bytes | None) -> tuple[list[int], int]:
    return await item_reference(llm, ids, "audio", None if content is None else decoded(content))


def ref_request(ids: list[int], content: bytes) -> pb.GenerateRequest:
    return media_request(ids, data_url(content, "audio/wav"), modality="audio")


async def tensor_request(llm: Any, ids: dict[str, Any], content: bytes) -> pb.GenerateRequest:
    """The clip's ``input_features`` (``[1, 80, 3000]``) and ``feature_attention_mask``."""
    return await item_tensor_request(
        llm, ids["audio"], "audio", decoded(content), token=ids[AUDIO], encoder_key="input_features"
    )


def positions(request: pb.GenerateRequest, token: int) -> int:
    return sum(1 for t in request.tokenized.input_ids if t == token)


# The clip three ways -------------------------------------------------------------------------


async def test_a_media_ref_gives_vllms_own_ids_for_the_clip(media_worker, media_llm, ids) -> None:
    want, prompt_len = await reference(media_llm, ids["audio"], SOUND)
    got = await complete(media_worker, ref_request(ids["audio"], SOUND))
    assert list(got.output_ids) == want
    # one second of audio: the anchor's <|AUDIO|> became PER_SECOND positions
    assert got.prompt_tokens == prompt_len == len(ids["audio"]) - 1 + PER_SECOND
    # the clip moves the answer: without it, and with another clip, the ids differ
    assert (await reference(media_llm, ids["none"], None))[0] != want
    other = await complete(media_worker, ref_request(ids["audio"], OTHER))
    assert list(other.output_ids) == (await reference(media_llm, ids["audio"], OTHER))[0]
    assert list(other.output_ids) != want


async def test_preprocessed_tensors_give_the_same_ids(media_worker, media_llm, ids) -> None:
    want, prompt_len = await reference(media_llm, ids["audio"], SOUND)
    request = await tensor_request(media_llm, ids, SOUND)
    assert positions(request, ids[AUDIO]) == PER_SECOND
    got = await complete(media_worker, request)
    assert list(got.output_ids) == want
    assert got.prompt_tokens == prompt_len


async def test_a_shorter_clip_is_served_as_tensors(media_worker, media_llm, ids) -> None:
    # Its embeddings are counted from its own feature mask (vLLM's processor), not taken from
    # the longest clip's.
    short = sound(0.5, seed=2)
    want, _ = await reference(media_llm, ids["audio"], short)
    request = await tensor_request(media_llm, ids, short)
    assert positions(request, ids[AUDIO]) == PER_SECOND // 2
    assert list((await complete(media_worker, request)).output_ids) == want


async def test_media_refs_through_the_sidecar_give_the_same_ids(
    media_via_sidecar, media_llm, ids
) -> None:
    for content in (SOUND, OTHER):
        want, prompt_len = await reference(media_llm, ids["audio"], content)
        got = await complete(media_via_sidecar, ref_request(ids["audio"], content))
        assert list(got.output_ids) == want
        assert got.prompt_tokens == prompt_len


async def test_a_clip_at_another_sample_rate_is_refused(media_worker, ids) -> None:
    code, details = await answer(media_worker, ref_request(ids["audio"], sound(1.0, 3, rate=8000)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "resampled with torchaudio" in details
    assert (await media_worker.HealthCheck(pb.HealthCheckRequest())).healthy


# Broken audio tensors ----------------------------------------------------------------------------


def _mask(b: Any, edit: Any) -> None:
    """``edit`` (a numpy function) applied to the feature mask's values."""
    if "feature_attention_mask" not in b.model_specific_tensors:
        raise IndexError("no mask")  # removed by an earlier fault: this one is left out
    message = b.model_specific_tensors["feature_attention_mask"]
    values = np.frombuffer(bytes(message.inline), dtype=np.dtype(message.dtype)).copy()
    message.inline = edit(values).astype(values.dtype).tobytes()


def _shape(b: Any, shape: list[int]) -> None:
    b.pixel_values.shape[:] = shape


#: name -> (what it does to a good audio request's ``mm_inputs``, the text the refusal holds).
BAD: dict[str, tuple[Any, str]] = {
    "dtype": (lambda b: setattr(b.pixel_values, "dtype", "int32"), "takes a floating tensor"),
    "mask dtype": (
        lambda b: setattr(b.model_specific_tensors["feature_attention_mask"], "dtype", "float32"),
        "takes an integer tensor",
    ),
    "mel bins": (lambda b: _shape(b, [1, 40, 6000]), "this model takes [80, 3000]"),
    "bytes": (lambda b: setattr(b.pixel_values, "inline", b.pixel_values.inline[:-4]), "bytes"),
    "silent mask": (lambda b: _mask(b, np.zeros_like), "makes no embeddings"),
    "longer mask": (
        lambda b: _mask(b, lambda v: (np.arange(v.size) < 200).astype(v.dtype)),
        "fewer than the 50",
    ),
    "a position short": (
        lambda b: setattr(b.mm_placeholders[0], "length", b.mm_placeholders[0].length - 1),
        "fewer than the",
    ),
    "no mask": (
        lambda b: b.model_specific_tensors.__delitem__("feature_attention_mask"),
        "this model takes",
    ),
    "not batched": (lambda b: b.ClearField("batched_keys"), "this model takes"),
    "video modality": (
        lambda b: setattr(b, "modality", common_pb2.VIDEO),
        "does not accept video input",
    ),
    "outside the prompt": (lambda b: setattr(b.mm_placeholders[0], "offset", 10_000), "outside"),
    "token id": (lambda b: setattr(b, "im_token_id", 7), "no im_token_id 7"),
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def good(media_llm: Any, ids: dict[str, Any]) -> tuple[pb.GenerateRequest, list[int]]:
    content = sound(1.0, seed=4)
    request = await tensor_request(media_llm, ids, content)
    return request, (await reference(media_llm, ids["audio"], content))[0]


async def test_each_broken_audio_tensor_is_invalid_argument_naming_it(media_worker, good) -> None:
    request, want = good
    await each_fault_is_refused(media_worker, request, want, BAD)


async def test_fuzzed_audio_tensors_get_a_client_fault_or_an_answer_and_the_engine_lives(
    media_worker, good
) -> None:
    """Seeded (``SMG_FUZZ_SEED``; ``SMG_FUZZ_AUDIO_EXAMPLES`` draws): :mod:`smg_it.fuzz_items`
    over :data:`BAD`."""
    undone_by = {"dtype": ("dtype",), "shape": ("mel bins",), "span": ("a position short",
                 "outside the prompt")}  # fmt: skip
    request, want = good
    examples = int(os.environ.get("SMG_FUZZ_AUDIO_EXAMPLES", "120"))
    await fuzz(media_worker, request, want, BAD, undone_by=undone_by, examples=examples)

"""The media identity across a prefill/decode split, engine-free: what the prefill side returns
of vLLM's processed input, and what the decode side accepts without pixels (the real engines:
tests-integration/test_nixl_prefill_decode.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm import media_identity

pytestmark = pytest.mark.unit

IMAGE, VIDEO = 1, 3


@dataclass
class Range:
    offset: int
    length: int
    is_embed: Any = None


@dataclass
class Elem:
    data: Any


def _engine_input() -> dict[str, Any]:
    """A video item at 1..4 and two image items at 6..9 and 10..12 of a 14-token prompt; the
    images' embedding positions hold token 9 (a mask), the video's range is all embeddings."""
    ids = [1, 5, 5, 5, 5, 2, 8, 9, 9, 8, 8, 9, 8, 3]
    return {
        "prompt_token_ids": ids,
        "mm_hashes": {"image": ["img-a", "img-b"], "video": ["vid"]},
        "mm_placeholders": {
            "image": [
                Range(6, 4, np.array([False, True, True, False])),
                Range(10, 3, np.array([False, True, False])),
            ],
            "video": [Range(1, 4)],
        },
        "mm_kwargs": {
            "image": [
                {"pixel_values": Elem(np.zeros(3)), "image_grid_thw": Elem(np.array([1, 2, 2]))},
                {"pixel_values": Elem(np.zeros(3)), "image_grid_thw": Elem(np.array([1, 4, 2]))},
            ],
            "video": [{"second_per_grid_ts": Elem(np.array(0.5, dtype=np.float16))}],
        },
    }


def test_the_identity_has_the_expanded_ids_and_one_pixel_less_batch_per_modality() -> None:
    identity = media_identity.identity_of(_engine_input())
    assert list(identity.prompt_token_ids) == _engine_input()["prompt_token_ids"]
    video, image = identity.mm_inputs, identity.extra_mm_inputs[0]  # in prompt order
    assert len(identity.extra_mm_inputs) == 1
    assert (video.modality, list(video.mm_hashes)) == (VIDEO, ["vid"])
    assert [(p.offset, p.length) for p in video.mm_placeholders] == [(1, 4)]
    assert not video.HasField("im_token_id")  # the whole range embeds
    assert (image.modality, list(image.mm_hashes)) == (IMAGE, ["img-a", "img-b"])
    assert [(p.offset, p.length) for p in image.mm_placeholders] == [(6, 4), (10, 3)]
    assert image.im_token_id == 9
    for batch in (video, image):
        assert not batch.HasField("pixel_values")
        assert "pixel_values" not in batch.model_specific_tensors


def test_grid_tensors_are_stacked_one_row_per_item_and_widened() -> None:
    identity = media_identity.identity_of(_engine_input())
    video, image = identity.mm_inputs, identity.extra_mm_inputs[0]
    grid = image.model_specific_tensors["image_grid_thw"]
    assert (list(grid.shape), grid.dtype) == ([2, 3], "int64")
    assert np.frombuffer(grid.inline, dtype="<i8").tolist() == [1, 2, 2, 1, 4, 2]
    assert list(image.batched_keys) == list(image.keep_on_cpu_keys) == ["image_grid_thw"]
    timing = video.model_specific_tensors["second_per_grid_ts"]
    assert (list(timing.shape), timing.dtype) == ([1], "float32")
    assert np.frombuffer(timing.inline, dtype="<f4").tolist() == [0.5]


def test_embedding_positions_of_different_tokens_name_no_im_token_id() -> None:
    engine_input = _engine_input()
    engine_input["prompt_token_ids"][8] = 4  # image a embeds tokens 9 and 4
    image = media_identity.identity_of(engine_input).extra_mm_inputs[0]
    assert not image.HasField("im_token_id")


def _decode_request(
    ids: list[int], ranges: list[tuple[int, int]], hashes: list[str], modality: int = IMAGE
) -> pb.GenerateRequest:
    request = pb.GenerateRequest(request_id="d", tokenized=pb.TokenizedInput(input_ids=ids))
    request.mm_inputs.modality = modality
    request.mm_inputs.mm_hashes.extend(hashes)
    for offset, length in ranges:
        request.mm_inputs.mm_placeholders.add(offset=offset, length=length)
    return request


def test_the_decode_side_salts_the_prompt_with_the_items_hashes() -> None:
    ids = [1, 8, 9, 9, 8, 2, 8, 9, 8, 3]
    request = _decode_request(ids, [(1, 4), (6, 3)], ["h1", "h2"])
    assert media_identity.pixel_less(request)
    assert media_identity.decode_salt(request, ids) == "mm:h1,h2"
    request.mm_inputs.pixel_values.dtype = "float32"  # pixels: the ordinary tensor path
    assert not media_identity.pixel_less(request)
    assert not media_identity.pixel_less(pb.GenerateRequest())


def test_only_a_remote_prefill_brings_the_kv() -> None:
    assert media_identity.remote_prefill({"do_remote_prefill": True, "remote_host": "h"})
    assert not media_identity.remote_prefill({"do_remote_decode": True})
    assert not media_identity.remote_prefill(None)


@pytest.mark.parametrize(
    ("ranges", "hashes", "modality", "message"),
    [
        ([(1, 4)], [], IMAGE, "needs one mm_hash per item (0 for 1 placeholders)"),
        ([(1, 4)], ["h", "h2"], IMAGE, "needs one mm_hash per item (2 for 1 placeholders)"),
        ([], [], IMAGE, "mm_placeholders is empty"),
        ([(7, 4)], ["h"], IMAGE, "7+4 is outside the 10-token prompt"),
        ([(1, 0)], ["h"], IMAGE, "1+0 is outside"),
        ([(1, 4), (3, 2)], ["h", "h2"], IMAGE, "placeholders overlap"),
        ([(6, 4)], ["h"], IMAGE, "the prompt ends inside a multimodal placeholder"),
        ([(1, 4)], ["x" * 257], IMAGE, "257 characters"),
        ([(1, 4)], ["h"], 7, "modality 7 is not supported"),
    ],
)
def test_a_bad_identity_is_refused(
    ranges: list[tuple[int, int]], hashes: list[str], modality: int, message: str
) -> None:
    ids = [1, 8, 9, 9, 8, 2, 8, 9, 8, 3]
    with pytest.raises(InvalidRequest) as refused:
        media_identity.decode_salt(_decode_request(ids, ranges, hashes, modality), ids)
    assert message in str(refused.value)

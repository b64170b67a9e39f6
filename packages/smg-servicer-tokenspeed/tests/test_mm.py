"""Router-preprocessed multimodal items to plain values: the per-modality rules."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_tokenspeed import mm

pytestmark = pytest.mark.unit
PIXELS = pb.TensorData(shape=[1, 2], dtype="float32", inline=struct.pack("<2f", 0.5, 1.5))
GRID = pb.TensorData(shape=[1, 3], dtype="int64", inline=struct.pack("<3q", 1, 2, 2))


def item(modality: int = common_pb2.IMAGE, **kwargs: Any) -> pb.MultimodalItem:
    placeholders = kwargs.pop("placeholders", [pb.PlaceholderRange(offset=1, length=2)])
    tensors = kwargs.pop("tensors", {})
    message = pb.MultimodalItem(modality=modality, placeholders=placeholders, **kwargs)
    for name, tensor in tensors.items():
        message.model_specific_tensors[name].CopyFrom(tensor)
    if "encoder_input" not in kwargs:
        message.encoder_input.CopyFrom(PIXELS)
    return message


def request(*items: pb.MultimodalItem, **kwargs: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="r",
        tokenized=pb.TokenizedInput(input_ids=[1, 9, 9, 2, 3]),
        mm_inputs=pb.MultimodalInputs(items=list(items)),
        **kwargs,
    )


def test_text_requests_have_no_items() -> None:
    plain = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[1]))
    assert mm.items(plain) is None


def test_an_image_item() -> None:
    digest = bytes(range(1, 33))
    got = mm.items(request(item(content_hash=digest, placeholder_token_id=9,
                                tensors={"image_grid_thw": GRID})))  # fmt: skip
    assert got is not None
    (one,) = got
    assert one.modality == "image"
    assert one.hash == int.from_bytes(digest[:8], "little")
    assert one.offsets == [(1, 2)]
    assert one.feature is not None and one.feature.shape == (1, 2)
    assert set(one.model_specific) == {"image_grid_thw"}
    assert one.placeholder_token_id == 9


@pytest.mark.parametrize(
    ("req", "text"),
    [
        (request(), "at least one item"),
        (request(item(placeholders=[])), "placeholders must not be empty"),
        (request(item(placeholders=[pb.PlaceholderRange(offset=1, length=0)])), "length 0"),
        (request(item(placeholders=[pb.PlaceholderRange(offset=4, length=2)])), "outside"),
        (request(item(tensors={"video_grid_thw": GRID})), "must not carry video_grid_thw"),
        (request(item(common_pb2.VIDEO)), "a video item carries video_grid_thw"),
        (request(item(common_pb2.VIDEO, tensors={"video_grid_thw": GRID,
                                                 "image_grid_thw": GRID})), "video item"),
        (request(item(common_pb2.AUDIO, tensors={"image_grid_thw": GRID})), "carries no grid"),
        (request(item(common_pb2.MODALITY_UNSPECIFIED)), "IMAGE, VIDEO or AUDIO"),
        (request(item(placeholder_token_id=9), item(placeholder_token_id=8)), "conflicting"),
        (request(item(encoder_input=pb.TensorData(shape=[3], dtype="float32",
                                                  inline=b"\0" * 4))), "encoder_input"),
    ],
)  # fmt: skip
def test_invalid_items(req: pb.GenerateRequest, text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        mm.items(req)
    assert text in err.value.message


def test_only_epd_prefill_and_pd_decode_may_omit_the_encoder_input() -> None:
    bare = pb.MultimodalItem(modality=common_pb2.IMAGE,
                             placeholders=[pb.PlaceholderRange(offset=1, length=2)])  # fmt: skip
    with pytest.raises(InvalidRequest, match="encoder_input is required"):
        mm.items(request(bare))
    # A decode worker's KV comes from its prefill (kv_bootstrap_info): it encodes nothing.
    kv = pb.KvBootstrapInfo(bootstrap_host="h", bootstrap_port=1, bootstrap_room=7)
    got = mm.items(request(bare, kv_bootstrap_info=kv), decode_role=True)
    assert got is not None and got[0].feature is None and got[0].offsets == [(1, 2)]
    with pytest.raises(InvalidRequest, match="encoder_input is required"):
        mm.items(request(bare, kv_bootstrap_info=kv))  # a prefill encodes its own pixels
    with pytest.raises(InvalidRequest, match="encoder_input is required"):
        mm.items(request(bare), decode_role=True)  # a decode with no prefill behind it
    rooms = pb.EncodeBootstrapInfo(
        items=[pb.EncodeItemBootstrapInfo(item_index=0, bootstrap_host="h", bootstrap_port=1,
                                          bootstrap_room=5)]
    )  # fmt: skip
    got = mm.items(request(bare, encode_bootstrap_info=rooms))
    assert got is not None and got[0].feature is None
    assert got[0].encode_handshake == {"bootstrap_host": "h", "bootstrap_port": 1,
                                       "bootstrap_room": 5}  # fmt: skip
    far = pb.EncodeBootstrapInfo(items=[pb.EncodeItemBootstrapInfo(item_index=3)])
    with pytest.raises(InvalidRequest, match="names item 3"):
        mm.items(request(bare, encode_bootstrap_info=far))
    alone = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[1]),
                               encode_bootstrap_info=rooms)  # fmt: skip
    with pytest.raises(InvalidRequest, match="needs mm_inputs"):
        mm.items(alone)

"""Router-preprocessed multimodal items (``GenerateRequest.mm_inputs``) as plain values, pure.

Each ``MultimodalItem`` carries its modality, a content hash, the encoder input (pixel values or
features), model-specific tensors (``image_grid_thw``, ...) and its placeholder ranges in the
prompt. The checks (INVALID_ARGUMENT): at least one item; placeholders non-empty, of positive
length and inside the prompt; an image carries no ``video_grid_thw``, a video carries
``video_grid_thw`` and no ``image_grid_thw``, audio carries no grid; one placeholder token id per
modality; the encoder input may be left out only by an EPD prefill request (one that names the
encode workers in ``encode_bootstrap_info``), whose items must exist. Tensors are read with core's
:func:`smg_servicer_core.tensors.read_tensor` (inline bytes or shared memory, read then unlinked).

An encode worker's ``EncodeRequest`` (:func:`encode_item`) carries exactly one item, with its
encoder input, and one bootstrap room: TokenSpeed's ``EncodeRequest`` has one room for all its
items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.tensors import RawTensor, read_tensor

MODALITIES: dict[int, str] = {
    common_pb2.IMAGE: "image",
    common_pb2.VIDEO: "video",
    common_pb2.AUDIO: "audio",
}
_GRIDS = ("image_grid_thw", "video_grid_thw")


@dataclass(frozen=True)
class MmItem:
    modality: str
    #: The first 8 bytes of the content hash, little-endian (None: TokenSpeed hashes the data).
    hash: int | None
    #: Inclusive ``(start, end)`` prompt positions per placeholder range.
    offsets: list[tuple[int, int]]
    feature: RawTensor | None
    model_specific: dict[str, RawTensor] = field(default_factory=dict[str, RawTensor])
    placeholder_token_id: int | None = None
    #: EPD: the encode worker that holds this item's embedding.
    encode_handshake: dict[str, object] | None = None


def _grid_rule(modality: str, names: set[str], where: str) -> None:
    grids = names & set(_GRIDS)
    if modality == "image" and "video_grid_thw" in grids:
        raise InvalidRequest(f"{where}: an image item must not carry video_grid_thw")
    if modality == "video" and grids != {"video_grid_thw"}:
        raise InvalidRequest(f"{where}: a video item carries video_grid_thw and no image_grid_thw")
    if modality == "audio" and grids:
        raise InvalidRequest(f"{where}: an audio item carries no grid")


def _item(item: pb.MultimodalItem, index: int, prompt_len: int | None, featureless: bool) -> MmItem:
    where = f"mm_inputs.items[{index}]"
    modality = MODALITIES.get(int(item.modality))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    if modality is None:
        raise InvalidRequest(f"{where}: modality must be IMAGE, VIDEO or AUDIO")
    if not item.placeholders:
        raise InvalidRequest(f"{where}: placeholders must not be empty")
    offsets: list[tuple[int, int]] = []
    for p in item.placeholders:
        if p.length == 0:
            raise InvalidRequest(f"{where}: a placeholder has length 0")
        if prompt_len is not None and p.offset + p.length > prompt_len:
            raise InvalidRequest(
                f"{where}: placeholder {p.offset}+{p.length} is outside the prompt ({prompt_len})"
            )
        offsets.append((p.offset, p.offset + p.length - 1))
    names = set(item.model_specific_tensors)
    _grid_rule(modality, names, where)
    if item.HasField("encoder_input"):
        feature: RawTensor | None = read_tensor(item.encoder_input, f"{where}.encoder_input")
    elif featureless:
        feature = None
    else:
        raise InvalidRequest(
            f"{where}: encoder_input is required (only an EPD prefill, whose embedding comes from "
            "the encode worker, and a PD decode, whose KV comes from the prefill, omit it)"
        )
    tensors = {
        name: read_tensor(item.model_specific_tensors[name], f"{where}.{name}")
        for name in sorted(names)
    }
    digest = bytes(item.content_hash)
    return MmItem(
        modality=modality,
        hash=int.from_bytes(digest[:8], "little") if digest else None,
        offsets=offsets,
        feature=feature,
        model_specific=tensors,
        placeholder_token_id=(
            item.placeholder_token_id if item.HasField("placeholder_token_id") else None
        ),
    )


def items(request: pb.GenerateRequest, decode_role: bool = False) -> list[MmItem] | None:
    """The request's multimodal items (None: a text request). An item's encoder input may be
    left out where nothing on this worker encodes it: an EPD prefill (``encode_bootstrap_info``:
    the encode worker sends the embedding) and, on a decode worker (``decode_role``), a request
    whose KV a prefill sends (``kv_bootstrap_info``). The decode still needs the items' spans,
    hashes and grids: TokenSpeed pads the prompt and computes M-RoPE positions from them."""
    epd = request.HasField("encode_bootstrap_info")
    featureless = epd or (decode_role and request.HasField("kv_bootstrap_info"))
    if not request.HasField("mm_inputs"):
        if epd:
            raise InvalidRequest("encode_bootstrap_info needs mm_inputs")
        return None
    if not request.mm_inputs.items:
        raise InvalidRequest("mm_inputs must carry at least one item")
    prompt_len = len(request.tokenized.input_ids)
    out = [
        _item(item, i, prompt_len, featureless) for i, item in enumerate(request.mm_inputs.items)
    ]
    tokens: dict[str, int] = {}
    for item in out:
        if item.placeholder_token_id is None:
            continue
        seen = tokens.setdefault(item.modality, item.placeholder_token_id)
        if seen != item.placeholder_token_id:
            raise InvalidRequest(
                f"conflicting placeholder token ids for {item.modality}: "
                f"{seen} and {item.placeholder_token_id}"
            )
    if epd:
        for room in request.encode_bootstrap_info.items:
            if room.item_index >= len(out):
                raise InvalidRequest(
                    f"encode_bootstrap_info names item {room.item_index}; there are {len(out)}"
                )
            handshake: dict[str, object] = {
                "bootstrap_host": room.bootstrap_host,
                "bootstrap_port": room.bootstrap_port,
                "bootstrap_room": room.bootstrap_room,
            }
            old = out[room.item_index]
            out[room.item_index] = MmItem(
                old.modality, old.hash, old.offsets, old.feature, old.model_specific,
                old.placeholder_token_id, handshake,
            )  # fmt: skip
    return out


def encode_item(request: Any) -> tuple[MmItem, int]:
    """A ``TokenSpeedEncoder.EncodeRequest``'s one item (its encoder input required;
    placeholders as in a prompt, which the encode worker does not see) and the bootstrap room
    its embedding goes to."""
    if not request.HasField("mm_inputs"):
        raise InvalidRequest("mm_inputs is required")
    count, rooms = len(request.mm_inputs.items), len(request.items)
    if count != 1 or rooms != 1:
        raise InvalidRequest(
            f"an encode request carries exactly one item and one room assignment, got {count} "
            f"item(s) and {rooms} assignment(s)"
        )
    item = _item(request.mm_inputs.items[0], 0, None, featureless=False)
    room = int(request.items[0].bootstrap_room)
    if room < 0:
        raise InvalidRequest(f"bootstrap_room must be >= 0, got {room}")
    return item, room

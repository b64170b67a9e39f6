"""Images across a prefill/decode split (vLLM), engine-free.

The prefill worker fetches and processes a request's media refs; the decode worker then holds the
prompt's KV, pulled over the KV connector, and needs no pixels. Two halves:

- :func:`identity_of` (prefill side): what the prefill worker learnt of the media, as the wire's
  ``MediaIdentity`` returned on ``GenerateComplete``: the expanded prompt ids, and one pixel-less
  ``MultimodalInputs`` per modality (hashes, placeholders, ``im_token_id`` where the range's
  embedding positions share one token, the grid tensors M-RoPE models read, one row per item).
- :func:`decode_salt` (decode side): a request that carries that identity (``mm_inputs`` without
  ``pixel_values``) is served as a token prompt salted with the items' hashes, so its prefix
  cache never mixes with a text prompt of the same ids. Only with ``kv_transfer_params`` asking
  for a remote prefill: without the transferred KV the engine would read the placeholders as
  text and answer something else, silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm import mm

#: vLLM's modality name -> the wire's ``Modality``.
MODALITY_VALUES: dict[str, int] = {"image": 1, "audio": 2, "video": 3}
#: The per-item tensors a decode side needs without the pixels (M-RoPE grids and timings).
GRID_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts", "video_second_per_grid")


def _batches(request: Any) -> list[tuple[str, Any]]:
    batches = [("mm_inputs", request.mm_inputs)] if request.HasField("mm_inputs") else []
    return batches + [(f"extra_mm_inputs[{i}]", b) for i, b in enumerate(request.extra_mm_inputs)]


def pixel_less(request: Any) -> bool:
    """Whether the request carries multimodal batches and not one of them has pixels (the
    decode side of a prefill/decode split)."""
    batches = _batches(request)
    return bool(batches) and not any(b.HasField("pixel_values") for _, b in batches)


def remote_prefill(kv: Mapping[str, Any] | None) -> bool:
    return kv is not None and bool(kv.get("do_remote_prefill"))


def decode_salt(request: Any, ids: Sequence[int]) -> str:
    """The cache salt of a pixel-less request (``mm:`` and its items' hashes), every item's
    identity checked against the prompt: a known modality, one hash per placeholder, ranges
    inside the prompt and apart, and the prompt's last position outside them (the decode side
    computes that one position itself, from the ids alone)."""
    hashes: list[str] = []
    spans: list[tuple[int, int]] = []
    for where, batch in _batches(request):
        _, count = mm.batch_modality(batch, where)
        if len(batch.mm_hashes) != count:
            raise InvalidRequest(
                f"{where}: a request without pixels needs one mm_hash per item "
                f"({len(batch.mm_hashes)} for {count} placeholders)"
            )
        mm.check_hash_lengths(batch.mm_hashes, where)
        hashes += [str(h) for h in batch.mm_hashes]
        spans += [
            mm.placeholder_span(placeholder, i, where, len(ids))
            for i, placeholder in enumerate(batch.mm_placeholders)
        ]
    spans = mm.check_apart(spans)
    if spans and spans[-1][1] >= len(ids):
        raise InvalidRequest(
            "the prompt ends inside a multimodal placeholder: the decode side computes the last "
            "position from its token id alone"
        )
    return "mm:" + ",".join(hashes)


def _embed_token(ids: Sequence[int], offset: int, is_embed: Any) -> int | None:
    """The one token id at a range's embedding positions (None: no mask, or several ids)."""
    if is_embed is None:
        return None
    mask = np.asarray(is_embed.cpu() if hasattr(is_embed, "cpu") else is_embed, dtype=bool)
    window = np.asarray(ids[offset : offset + len(mask)])
    tokens = set(window[mask[: len(window)]].tolist())
    return tokens.pop() if len(tokens) == 1 else None


def _grid_tensor(rows: list[Any]) -> pb.TensorData:
    """Per-item rows stacked (one row per item), widened to float32 / int64, inline."""
    arrays = [np.asarray(r.cpu() if hasattr(r, "cpu") else r) for r in rows]
    stacked = np.stack(arrays)
    wide = stacked.astype("<f4") if stacked.dtype.kind == "f" else stacked.astype("<i8")
    dtype = "float32" if wide.dtype.kind == "f" else "int64"
    return pb.TensorData(shape=list(wide.shape), dtype=dtype, inline=wide.tobytes())


def _modality_batch(
    modality: str, ids: Sequence[int], hashes: Sequence[str], ranges: Sequence[Any], items: Any
) -> pb.MultimodalInputs:
    batch = pb.MultimodalInputs(modality=MODALITY_VALUES[modality], mm_hashes=list(hashes))
    tokens: set[int | None] = set()
    for r in ranges:
        batch.mm_placeholders.add(offset=int(r.offset), length=int(r.length))
        tokens.add(_embed_token(ids, int(r.offset), getattr(r, "is_embed", None)))
    if len(tokens) == 1 and (token := tokens.pop()) is not None:
        batch.im_token_id = token
    items = list(items or ())
    for key in GRID_KEYS:
        if items and all(key in item for item in items):
            batch.model_specific_tensors[key].CopyFrom(
                _grid_tensor([item[key].data for item in items])
            )
            batch.batched_keys.append(key)
            batch.keep_on_cpu_keys.append(key)
    return batch


def identity_of(engine_input: Mapping[str, Any]) -> pb.MediaIdentity:
    """The ``MediaIdentity`` of vLLM's processed engine input (``prompt_token_ids``,
    ``mm_hashes``, ``mm_placeholders``, ``mm_kwargs``, per modality), modalities in prompt
    order."""
    ids = [int(t) for t in engine_input["prompt_token_ids"]]
    hashes: Mapping[str, Sequence[str]] = engine_input["mm_hashes"]
    placeholders: Mapping[str, Sequence[Any]] = engine_input["mm_placeholders"]
    kwargs: Mapping[str, Any] = engine_input.get("mm_kwargs") or {}
    order = sorted(placeholders, key=lambda m: min(int(r.offset) for r in placeholders[m]))
    batches = [
        _modality_batch(m, ids, hashes[m], placeholders[m], kwargs.get(m))
        for m in order
        if placeholders[m]
    ]
    identity = pb.MediaIdentity(prompt_token_ids=ids)
    if batches:
        identity.mm_inputs.CopyFrom(batches[0])
        identity.extra_mm_inputs.extend(batches[1:])
    return identity

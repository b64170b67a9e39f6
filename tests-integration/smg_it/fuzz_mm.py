"""Router-preprocessed image requests for a vLLM worker of the tiny VLM, each broken one way: the
reliability fuzz's tensor cases (placeholder runs, tensor sizes and shapes, dtypes, hashes,
shared-memory names).

A good request is what vLLM's Idefics3 processor gives for one 56x56 tile (the tiny VLM splits
no image): ``pixel_values`` float32 ``[patches, 3, 56, 56]``, ``pixel_attention_mask`` bool
``[patches, 56, 56]``, ``num_patches`` int64 ``[items]`` (the sizes of the flat fields), and one
placeholder run per item ``<fake><global-img><image>x4<fake>`` whose 4 ``<image>`` positions take
the 4 embeddings the encoder makes of a tile. Built with numpy: no torch and no vLLM in the test
process. :data:`CASES` edit a good request; :func:`mutated_requests` draws several edits at once.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.tiny_vlm import image_token_ids

MAX_TOKENS = 4
#: Ordinary text either side of the image runs.
_TEXT = (1, 2, 3)


@dataclass(frozen=True)
class Vlm:
    """What a good request needs of the tiny VLM."""

    image_size: int
    image_seq_len: int
    image: int
    fake: int
    global_img: int

    @classmethod
    def of(cls, model: Path) -> Vlm:
        config = json.loads((model / "config.json").read_text())
        vision = config["vision_config"]
        tokens = image_token_ids(model)
        size, patch, scale = vision["image_size"], vision["patch_size"], config["scale_factor"]
        return cls(
            image_size=size,
            image_seq_len=(size // patch) ** 2 // scale**2,
            image=tokens["<image>"],
            fake=tokens["<fake_token_around_image>"],
            global_img=tokens["<global-img>"],
        )

    def run(self, embeds: int | None = None) -> list[int]:
        """One item's placeholder run (``embeds`` image positions, the model's by default)."""
        count = self.image_seq_len if embeds is None else embeds
        return [self.fake, self.global_img, *[self.image] * count, self.fake]


@dataclass
class Case:
    """A request and the shared-memory segments this process made for it (closed and unlinked
    by :meth:`cleanup` whatever the worker did with them)."""

    request: pb.GenerateRequest
    segments: list[shared_memory.SharedMemory]

    def cleanup(self) -> None:
        for segment in self.segments:
            segment.close()
            with contextlib.suppress(FileNotFoundError):  # the worker read and unlinked it
                segment.unlink()


def put(message: Any, array: np.ndarray, dtype: str | None = None) -> None:
    """``array`` into a ``TensorData`` as inline little-endian bytes."""
    message.shape.extend(int(d) for d in array.shape)
    message.dtype = dtype or str(array.dtype)
    message.inline = np.ascontiguousarray(array).tobytes()


def to_shm(message: Any, segments: list[shared_memory.SharedMemory]) -> None:
    """Move an inline ``TensorData``'s bytes into a new shared-memory segment."""
    raw = bytes(message.inline)
    segment = shared_memory.SharedMemory(create=True, size=max(len(raw), 1))
    assert segment.buf is not None
    segment.buf[: len(raw)] = raw
    segments.append(segment)
    message.shm.name, message.shm.offset, message.shm.nbytes = segment.name, 0, len(raw)


def good(vlm: Vlm, items: int = 1, *, seed: int = 0, shm: bool = False) -> Case:
    """A request the worker serves: ``items`` one-tile images, greedy, ``MAX_TOKENS`` tokens."""
    ids = list(_TEXT)
    offsets: list[int] = []
    for _ in range(items):
        offsets.append(len(ids))
        ids += [*vlm.run(), *_TEXT]
    request = generate_request("vllm", ids, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    batch = request.mm_inputs
    batch.modality = common_pb2.IMAGE
    batch.im_token_id = vlm.image
    rng = np.random.default_rng(seed)
    size = vlm.image_size
    put(batch.pixel_values, rng.uniform(-1, 1, (items, 3, size, size)).astype(np.float32))
    put(batch.model_specific_tensors["pixel_attention_mask"], np.ones((items, size, size), bool))
    put(batch.model_specific_tensors["num_patches"], np.ones(items, np.int64))
    batch.flat_keys["pixel_values"] = "num_patches"
    batch.flat_keys["pixel_attention_mask"] = "num_patches"
    batch.batched_keys.append("num_patches")
    batch.keep_on_cpu_keys.append("num_patches")
    for offset in offsets:
        batch.mm_placeholders.add(offset=offset, length=len(vlm.run()))
    batch.mm_hashes.extend(f"fuzz-{seed}-{i}-{secrets.token_hex(4)}" for i in range(items))
    segments: list[shared_memory.SharedMemory] = []
    if shm:
        for tensor in (batch.pixel_values, *batch.model_specific_tensors.values()):
            to_shm(tensor, segments)
    return Case(request, segments)


# The edits ---------------------------------------------------------------------------------------

Edit = Callable[[Case, Vlm], None]


def _batch(case: Case) -> Any:
    return case.request.mm_inputs


def _pixels(case: Case) -> Any:
    return _batch(case).pixel_values


def _extra(case: Case, name: str) -> Any:
    return _batch(case).model_specific_tensors[name]


def _ids(case: Case) -> Any:
    return case.request.tokenized.input_ids


def _set_ids(case: Case, ids: list[int]) -> None:
    del case.request.tokenized.input_ids[:]
    case.request.tokenized.input_ids.extend(ids)


def _retensor(message: Any, array: np.ndarray, dtype: str | None = None) -> None:
    message.Clear()
    put(message, array, dtype)


def _noise(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(7).uniform(-1, 1, shape).astype(np.float32)


def _zero_tile(case: Case, vlm: Vlm) -> None:
    """An all-zero tile: Idefics3's tower drops it as padding, leaving the item no embeddings."""
    size = vlm.image_size
    _retensor(_pixels(case), np.zeros((1, 3, size, size), np.float32))


def _short_masked(case: Case, vlm: Vlm) -> None:
    """The run holds 3 ``<image>`` positions where the encoder makes 4 (the prompt's fourth is
    left out of the range)."""
    _batch(case).mm_placeholders[0].length = len(vlm.run()) - 2


def _short_in_prompt(case: Case, vlm: Vlm) -> None:
    """The prompt itself holds a 3-position run, the range covering all of it."""
    first = _batch(case).mm_placeholders[0].offset
    ids = list(_ids(case))
    ids[first : first + len(vlm.run())] = vlm.run(vlm.image_seq_len - 1)
    _set_ids(case, ids)
    _batch(case).mm_placeholders[0].length = len(vlm.run(vlm.image_seq_len - 1))


def _short_plain(case: Case, vlm: Vlm) -> None:
    """No ``im_token_id``: every position of a 3-long range takes an embedding."""
    batch = _batch(case)
    batch.ClearField("im_token_id")
    batch.mm_placeholders[0].offset += 2
    batch.mm_placeholders[0].length = vlm.image_seq_len - 1


def _one_plain(case: Case, vlm: Vlm) -> None:
    batch = _batch(case)
    batch.ClearField("im_token_id")
    batch.mm_placeholders[0].offset += 2
    batch.mm_placeholders[0].length = 1


def _long_plain(case: Case, vlm: Vlm) -> None:
    """No ``im_token_id``: all 7 positions would take embeddings the encoder makes 4 of."""
    _batch(case).ClearField("im_token_id")


def _long_masked(case: Case, vlm: Vlm) -> None:
    """5 ``<image>`` positions in the run for a 4-embedding item."""
    first = _batch(case).mm_placeholders[0].offset
    ids = list(_ids(case))
    ids[first : first + len(vlm.run())] = vlm.run(vlm.image_seq_len + 1)
    _set_ids(case, ids)
    _batch(case).mm_placeholders[0].length = len(vlm.run(vlm.image_seq_len + 1))


def _zero_length(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_placeholders[0].length = 0


def _out_of_range(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_placeholders[0].offset = len(_ids(case)) - 2


def _far_out(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_placeholders[0].offset = 2**32 - 1


def _overflowing(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_placeholders[0].length = 2**32 - 1


def _overlapping(case: Case, vlm: Vlm) -> None:
    """Two items, the second run starting inside the first."""
    batch = _batch(case)
    batch.mm_placeholders[1].offset = batch.mm_placeholders[0].offset + 3


def _same_run_twice(case: Case, vlm: Vlm) -> None:
    batch = _batch(case)
    batch.mm_placeholders[1].offset = batch.mm_placeholders[0].offset


def _no_image_token_in_run(case: Case, vlm: Vlm) -> None:
    _batch(case).im_token_id = vlm.fake + 1000


def _token_outside_vocab(case: Case, vlm: Vlm) -> None:
    _batch(case).im_token_id = 2**32 - 1


def _mask_of_text(case: Case, vlm: Vlm) -> None:
    """``im_token_id`` names a token the run holds once (the mask is 1 position)."""
    _batch(case).im_token_id = vlm.global_img


def _more_placeholders(case: Case, vlm: Vlm) -> None:
    batch = _batch(case)
    batch.mm_placeholders.add(offset=0, length=2)


def _no_placeholders(case: Case, vlm: Vlm) -> None:
    _batch(case).ClearField("mm_placeholders")


def _small_tile(case: Case, vlm: Vlm) -> None:
    """A 28x28 tile where the vision tower takes 56x56 (its mask to match)."""
    half = vlm.image_size // 2
    _retensor(_pixels(case), _noise((1, 3, half, half)))
    _retensor(_extra(case, "pixel_attention_mask"), np.ones((1, half, half), bool))


def _big_tile(case: Case, vlm: Vlm) -> None:
    double = vlm.image_size * 2
    _retensor(_pixels(case), _noise((1, 3, double, double)))
    _retensor(_extra(case, "pixel_attention_mask"), np.ones((1, double, double), bool))


def _flat_pixels(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_pixels(case), _noise((1, 3 * size * size)))


def _channels(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_pixels(case), _noise((1, 4, size, size)))


def _mask_shape(case: Case, vlm: Vlm) -> None:
    half = vlm.image_size // 2
    _retensor(_extra(case, "pixel_attention_mask"), np.ones((1, half, half), bool))


def _no_mask(case: Case, vlm: Vlm) -> None:
    batch = _batch(case)
    del batch.model_specific_tensors["pixel_attention_mask"]
    del batch.flat_keys["pixel_attention_mask"]


def _two_tiles_one_item(case: Case, vlm: Vlm) -> None:
    """Two tiles for one item (8 embeddings), the run still 4 positions."""
    size = vlm.image_size
    _retensor(_pixels(case), _noise((2, 3, size, size)))
    _retensor(_extra(case, "pixel_attention_mask"), np.ones((2, size, size), bool))
    _retensor(_extra(case, "num_patches"), np.array([2], np.int64))


def _sizes_over(case: Case, vlm: Vlm) -> None:
    _retensor(_extra(case, "num_patches"), np.array([2], np.int64))


def _sizes_zero(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_pixels(case), np.zeros((0, 3, size, size), np.float32))
    _retensor(_extra(case, "pixel_attention_mask"), np.ones((0, size, size), bool))
    _retensor(_extra(case, "num_patches"), np.array([0], np.int64))


def _sizes_negative(case: Case, vlm: Vlm) -> None:
    _retensor(_extra(case, "num_patches"), np.array([-1], np.int64))


def _sizes_2d(case: Case, vlm: Vlm) -> None:
    _retensor(_extra(case, "num_patches"), np.array([[1]], np.int64))


def _sizes_float(case: Case, vlm: Vlm) -> None:
    _retensor(_extra(case, "num_patches"), np.array([1.0], np.float32))


def _no_sizes(case: Case, vlm: Vlm) -> None:
    del _batch(case).model_specific_tensors["num_patches"]


def _huge_shape(case: Case, vlm: Vlm) -> None:
    del _pixels(case).shape[:]
    _pixels(case).shape.extend([2**31, 2**31, 3])


def _scalar_pixels(case: Case, vlm: Vlm) -> None:
    _retensor(_pixels(case), np.zeros((), np.float32))


def _int_pixels(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_pixels(case), np.zeros((1, 3, size, size), np.int64))


def _uint8_pixels(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_pixels(case), np.full((1, 3, size, size), 128, np.uint8))


def _bool_pixels(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_pixels(case), np.ones((1, 3, size, size), bool))


def _half_pixels(case: Case, vlm: Vlm) -> None:
    """float16 pixels for a float32 model: cast, served."""
    size = vlm.image_size
    _retensor(_pixels(case), _noise((1, 3, size, size)).astype(np.float16))


def _float_mask(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    _retensor(_extra(case, "pixel_attention_mask"), np.ones((1, size, size), np.float32))


def _unknown_dtype(case: Case, vlm: Vlm) -> None:
    _pixels(case).dtype = "complex64"


def _empty_dtype(case: Case, vlm: Vlm) -> None:
    _pixels(case).dtype = ""


def _dtype_itemsize_lie(case: Case, vlm: Vlm) -> None:
    """float32 bytes labelled float16: twice the bytes the shape says."""
    _pixels(case).dtype = "float16"


def _short_bytes(case: Case, vlm: Vlm) -> None:
    _pixels(case).inline = bytes(_pixels(case).inline)[:-4]


def _no_payload(case: Case, vlm: Vlm) -> None:
    _pixels(case).ClearField("inline")


def _remote(case: Case, vlm: Vlm) -> None:
    _pixels(case).remote.transport = "nixl"


def _no_hashes(case: Case, vlm: Vlm) -> None:
    """No ``mm_hashes``: the worker makes request-unique ones (served)."""
    _batch(case).ClearField("mm_hashes")


def _duplicate_hashes_same_image(case: Case, vlm: Vlm) -> None:
    """Two items of the same pixels under one hash (what content hashing gives): served."""
    batch = _batch(case)
    pixels = np.frombuffer(bytes(batch.pixel_values.inline), np.float32).reshape(2, 3, -1)
    pixels = np.concatenate([pixels[:1], pixels[:1]]).reshape(2, 3, vlm.image_size, -1)
    _retensor(batch.pixel_values, pixels)
    batch.mm_hashes[1] = batch.mm_hashes[0]


def _duplicate_hashes(case: Case, vlm: Vlm) -> None:
    """Two different images under one hash: the second would get the first's embeddings."""
    batch = _batch(case)
    batch.mm_hashes[1] = batch.mm_hashes[0]


def _too_many_hashes(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_hashes.append("extra")


def _too_few_hashes(case: Case, vlm: Vlm) -> None:
    del _batch(case).mm_hashes[1]


def _huge_hash(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_hashes[0] = "h" * 1_000_000


def _empty_hash(case: Case, vlm: Vlm) -> None:
    _batch(case).mm_hashes[0] = ""


def _shm_missing(case: Case, vlm: Vlm) -> None:
    pixels = _pixels(case)
    nbytes = len(pixels.inline)
    pixels.shm.name, pixels.shm.offset, pixels.shm.nbytes = "smg-fuzz-no-such-segment", 0, nbytes


def _shm_named(name: str) -> Edit:
    def edit(case: Case, vlm: Vlm) -> None:
        _shm_missing(case, vlm)
        _pixels(case).shm.name = name

    return edit


def _shm_wrong_size(case: Case, vlm: Vlm) -> None:
    """The handle's byte count disagrees with the shape."""
    to_shm(_pixels(case), case.segments)
    _pixels(case).shm.nbytes -= 4


def _shm_past_the_end(case: Case, vlm: Vlm) -> None:
    to_shm(_pixels(case), case.segments)
    _pixels(case).shm.offset = 8


def _shm_other_segment(case: Case, vlm: Vlm) -> None:
    """Another process's segment (this test's own, 64 bytes), named with the right byte count."""
    segment = shared_memory.SharedMemory(create=True, size=64)
    case.segments.append(segment)
    _shm_missing(case, vlm)
    _pixels(case).shm.name = segment.name


def _video(case: Case, vlm: Vlm) -> None:
    _batch(case).modality = common_pb2.VIDEO


def _audio(case: Case, vlm: Vlm) -> None:
    _batch(case).modality = common_pb2.AUDIO


def _unknown_modality(case: Case, vlm: Vlm) -> None:
    _batch(case).modality = 77


def _embeds_key(case: Case, vlm: Vlm) -> None:
    """The pixels named as precomputed embeddings."""
    _batch(case).encoder_input_key = "image_embeds"


def _unknown_key(case: Case, vlm: Vlm) -> None:
    size = vlm.image_size
    put(_batch(case).model_specific_tensors["not_a_field"], np.zeros((1, size), np.float32))


def _shared_sizes(case: Case, vlm: Vlm) -> None:
    """``num_patches`` neither batched nor flat: shared by the items."""
    del _batch(case).batched_keys[:]


def _over_the_item_limit(case: Case, vlm: Vlm) -> None:
    """Three images where the worker takes two (``--limit-mm-per-prompt``)."""
    replacement = good(vlm, 3, seed=3)
    case.request.CopyFrom(replacement.request)


def _extra_batch_overlaps(case: Case, vlm: Vlm) -> None:
    """An ``extra_mm_inputs`` batch whose run is the first batch's."""
    case.request.extra_mm_inputs.add().CopyFrom(_batch(case))


#: name -> (items in the good request, the edit, whether the answer must be a refusal).
CASES: dict[str, tuple[int, Edit, bool]] = {
    "placeholder: short run, masked": (1, _short_masked, True),
    "placeholder: short run in the prompt": (1, _short_in_prompt, True),
    "placeholder: short run, no mask": (1, _short_plain, True),
    "placeholder: one position, no mask": (1, _one_plain, True),
    "placeholder: long run, no mask": (1, _long_plain, True),
    "placeholder: long run, masked": (1, _long_masked, True),
    "placeholder: zero length": (1, _zero_length, True),
    "placeholder: past the prompt": (1, _out_of_range, True),
    "placeholder: offset 2**32-1": (1, _far_out, True),
    "placeholder: length 2**32-1": (1, _overflowing, True),
    "placeholder: overlapping": (2, _overlapping, True),
    "placeholder: one run twice": (2, _same_run_twice, True),
    "placeholder: extra batch on the same run": (1, _extra_batch_overlaps, True),
    "mask: no im_token_id in the run": (1, _no_image_token_in_run, True),
    "mask: im_token_id 2**32-1": (1, _token_outside_vocab, True),
    "mask: one position of another token": (1, _mask_of_text, True),
    "placeholder: more runs than items": (1, _more_placeholders, True),
    "placeholder: none": (1, _no_placeholders, True),
    "shape: 28x28 tile": (1, _small_tile, True),
    "shape: 112x112 tile": (1, _big_tile, True),
    "shape: flat pixels": (1, _flat_pixels, True),
    "shape: 4 channels": (1, _channels, True),
    "shape: mask of another size": (1, _mask_shape, True),
    "shape: no attention mask": (1, _no_mask, True),
    "shape: scalar pixels": (1, _scalar_pixels, True),
    "shape: 2**93 elements": (1, _huge_shape, True),
    "pixels: an all-zero tile": (1, _zero_tile, True),
    "sizes: two tiles for a 4-position run": (1, _two_tiles_one_item, True),
    "sizes: more than the pixels": (1, _sizes_over, True),
    "sizes: zero tiles": (1, _sizes_zero, True),
    "sizes: negative": (1, _sizes_negative, True),
    "sizes: 2-d": (1, _sizes_2d, True),
    "sizes: float": (1, _sizes_float, True),
    "sizes: missing": (1, _no_sizes, True),
    "sizes: shared, not batched": (1, _shared_sizes, True),
    "dtype: int64 pixels": (1, _int_pixels, True),
    "dtype: uint8 pixels": (1, _uint8_pixels, True),
    "dtype: bool pixels": (1, _bool_pixels, True),
    "dtype: float16 pixels": (1, _half_pixels, False),
    "dtype: float32 mask": (1, _float_mask, True),
    "dtype: complex64": (1, _unknown_dtype, True),
    "dtype: empty": (1, _empty_dtype, True),
    "dtype: itemsize lie": (1, _dtype_itemsize_lie, True),
    "bytes: 4 short": (1, _short_bytes, True),
    "bytes: no payload": (1, _no_payload, True),
    "bytes: remote transport": (1, _remote, True),
    "hashes: none": (2, _no_hashes, False),
    "hashes: one for two identical images": (2, _duplicate_hashes_same_image, False),
    "hashes: one for two different images": (2, _duplicate_hashes, True),
    "hashes: one too many": (2, _too_many_hashes, True),
    "hashes: one too few": (2, _too_few_hashes, True),
    "hashes: a million characters": (1, _huge_hash, True),
    "hashes: empty": (1, _empty_hash, True),
    "shm: missing segment": (1, _shm_missing, True),
    "shm: byte count off": (1, _shm_wrong_size, True),
    "shm: range past the end": (1, _shm_past_the_end, True),
    "shm: another process's segment": (1, _shm_other_segment, True),
    "shm: ../etc/passwd": (1, _shm_named("../etc/passwd"), True),
    "shm: /dev/shm/../x": (1, _shm_named("/dev/shm/../x"), True),
    "shm: ..": (1, _shm_named(".."), True),
    "shm: .": (1, _shm_named("."), True),
    "shm: empty name": (1, _shm_named(""), True),
    "shm: NUL": (1, _shm_named("a\x00b"), True),
    "shm: 300 characters": (1, _shm_named("s" * 300), True),
    "modality: video": (1, _video, True),
    "modality: audio": (1, _audio, True),
    "modality: 77": (1, _unknown_modality, True),
    "keys: pixels as embeddings": (1, _embeds_key, True),
    "keys: unknown tensor": (1, _unknown_key, True),
    "items: over the limit": (1, _over_the_item_limit, True),
}


def case(vlm: Vlm, name: str, *, seed: int = 0) -> Case:
    items, edit, _ = CASES[name]
    built = good(vlm, items, seed=seed)
    edit(built, vlm)
    return built


def must_refuse(name: str) -> bool:
    return CASES[name][2]


@st.composite
def mutated_requests(draw: st.DrawFn, vlm: Vlm) -> Case:
    """A good request (one or two images, inline or in shared memory) with one to three edits
    drawn from :data:`CASES` that apply to its item count, then now and then a placeholder or a
    tensor shape set at random."""
    items = draw(st.sampled_from([1, 2]))
    built = good(vlm, items, seed=draw(st.integers(0, 3)))
    names = [n for n, (k, _, _) in CASES.items() if k == items]
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        try:
            CASES[name][1](built, vlm)
        except (IndexError, ValueError):
            continue  # an earlier edit removed what this one edits
    batch = built.request.mm_inputs
    if batch.mm_placeholders and draw(st.integers(0, 3)) == 0:
        target = batch.mm_placeholders[draw(st.integers(0, len(batch.mm_placeholders) - 1))]
        target.offset = draw(st.integers(0, len(built.request.tokenized.input_ids) + 2))
        target.length = draw(st.integers(0, 12))
    if draw(st.integers(0, 5)) == 0:
        dims = draw(st.lists(st.sampled_from([0, 1, 2, 3, 28, 56, 57]), max_size=5))
        del batch.pixel_values.shape[:]
        batch.pixel_values.shape.extend(dims)
    if draw(st.integers(0, 3)) == 0:
        for tensor in (batch.pixel_values, *batch.model_specific_tensors.values()):
            if tensor.WhichOneof("payload") == "inline":
                to_shm(tensor, built.segments)
    return built

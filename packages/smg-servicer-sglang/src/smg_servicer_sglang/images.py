"""Images on SGLang's wire (issue #45), engine-free: the router-preprocessed ``mm_inputs`` of a
``GenerateRequest`` read and checked into :class:`Images`, which ``_sglang.build_generate`` turns
into SGLang's own multimodal items (one ``MultimodalDataItem`` per image, its placeholder span as
the item's offsets; the scheduler hashes each image into its pad values, as for SGLang's own
processor's output).

A model family is served when its rules are known here (:data:`FAMILIES`): how many positions one
image fills (Gemma3: a fixed count for its one picture size; Qwen2-VL: its patch grid's, merged
2 x 2, the grid sent as ``image_grid_thw``), the token that fills them and the tokens around them.
SGLang fills those positions with the image's embeddings in the forward pass, and a count that
does not match truncates embeddings, misplaces them or fails the pass, so every count is checked
before the scheduler sees the request: the number of images, each placeholder span (inside the
prompt, in order, apart, of the image's length, only the image token, between the family's start
and end tokens) and every image token of the prompt inside a span. SGLang's ``TensorData``
carries inline bytes only (no shared-memory payload on this wire). A language-only worker's
pictures are URLs instead (:func:`read_image_urls`): SGLang's encoders compute them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.tensors import RawTensor, read_tensor

#: Images one request may carry when the server sets no ``--limit-mm-data-per-request``.
MAX_IMAGES = 16
#: The pixel dtypes a vision tower takes (SGLang casts them to the model's dtype).
PIXEL_DTYPES = ("float32", "float16", "bfloat16")
#: The model families whose image rules this module knows (``config.model_type``): Gemma3 takes
#: whole pictures of one size, Qwen2-VL flattened patches with each picture's patch grid.
FAMILIES = ("gemma3", "qwen2_vl")
#: What a patch family's request may carry beside its pixels (the router sends both).
PATCH_TENSORS = ("image_grid_thw", "patches_per_image")

NOT_A_VISION_MODEL = (
    "mm_inputs: this SGLang worker's model does not take images (GetModelInfo says "
    "supports_vision=false)"
)


@dataclass(frozen=True)
class ImageRules:
    """How the served model takes images (from its config: :func:`rules_of`)."""

    family: str
    image_token_id: int
    start_id: int  # the token before each image's span
    end_id: int  # the token after it
    tokens_per_image: int  # 0: it depends on the picture (a patch family)
    image_size: int  # 0: any (a patch family)
    max_images: int = MAX_IMAGES
    #: A patch family's values per patch (channels x temporal patch x patch x patch), or 0.
    patch_features: int = 0
    #: Patches merged into one prompt position along each side (a patch family's).
    merge: int = 1
    video_token_id: int = -1


@dataclass(frozen=True)
class Images:
    """A request's checked images: ``pixel_values`` ``[N, 3, S, S]`` and one
    ``(offset, length)`` span of the prompt per image."""

    pixel_values: RawTensor
    spans: tuple[tuple[int, int], ...]
    rules: ImageRules
    #: A patch family's: each picture's patch grid (t, h, w), and the prompt (its M-RoPE
    #: positions are computed from it).
    grids: tuple[tuple[int, int, int], ...] = ()
    prompt: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.spans)


def rules_of(hf_config: Any, limits: Mapping[str, int] | None) -> ImageRules | None:
    """The rules of a served vision family, or None (images refused). ``limits``: SGLang's
    ``--limit-mm-data-per-request``."""
    family = str(getattr(hf_config, "model_type", "") or "")
    if family not in FAMILIES:
        return None
    vision = hf_config.vision_config
    cap = int((limits or {}).get("image", MAX_IMAGES))
    if family == "qwen2_vl":
        patch, temporal = int(vision.patch_size), int(vision.temporal_patch_size)
        return ImageRules(
            family=family,
            image_token_id=int(hf_config.image_token_id),
            start_id=int(hf_config.vision_start_token_id),
            end_id=int(hf_config.vision_end_token_id),
            tokens_per_image=0,
            image_size=0,
            max_images=cap,
            patch_features=3 * temporal * patch * patch,
            merge=int(vision.spatial_merge_size),
            video_token_id=int(hf_config.video_token_id),
        )
    return ImageRules(
        family=family,
        image_token_id=int(hf_config.image_token_index),
        start_id=int(hf_config.boi_token_index),
        end_id=int(hf_config.eoi_token_index),
        tokens_per_image=int(hf_config.mm_tokens_per_image),
        image_size=int(vision.image_size),
        max_images=cap,
    )


def _pixel_count(raw: RawTensor, rules: ImageRules) -> int:
    where = "mm_inputs.pixel_values"
    if raw.dtype not in PIXEL_DTYPES:
        raise InvalidRequest(f"{where}: dtype {raw.dtype} is not one of {', '.join(PIXEL_DTYPES)}")
    size = rules.image_size
    shape = raw.shape if len(raw.shape) == 4 else (1, *raw.shape)
    if len(shape) != 4 or shape[1:] != (3, size, size):
        raise InvalidRequest(
            f"{where}: shape {list(raw.shape)} is not [images, 3, {size}, {size}] "
            f"(this {rules.family} model's image size)"
        )
    count = shape[0]
    if not 1 <= count <= rules.max_images:
        raise InvalidRequest(f"{where}: {count} images; this worker takes 1 to {rules.max_images}")
    return count


def _spans(
    placeholders: Sequence[Any], ids: Sequence[int], lengths: Sequence[int], rules: ImageRules
) -> tuple[tuple[int, int], ...]:
    """Each picture's span: ``lengths[i]`` image tokens between the start and end tokens."""
    where = "mm_inputs.mm_placeholders"
    count = len(lengths)
    if len(placeholders) != count:
        raise InvalidRequest(f"{where}: {len(placeholders)} placeholders for {count} images")
    spans: list[tuple[int, int]] = []
    end = 0
    for i, placeholder in enumerate(placeholders):
        offset, length = int(placeholder.offset), int(placeholder.length)
        name = f"{where}[{i}]"
        if length != lengths[i]:
            raise InvalidRequest(
                f"{name}: length {length}; this image fills {lengths[i]} positions "
                f"of this {rules.family} model"
            )
        if offset < end or offset < 1 or offset + length >= len(ids):
            raise InvalidRequest(
                f"{name}: offset {offset} is not inside the prompt after the span before it"
            )
        if any(ids[j] != rules.image_token_id for j in range(offset, offset + length)):
            raise InvalidRequest(f"{name}: the span holds ids other than the image token")
        if ids[offset - 1] != rules.start_id or ids[offset + length] != rules.end_id:
            raise InvalidRequest(
                f"{name}: the span is not between the image start and end tokens "
                f"({rules.start_id}, {rules.end_id})"
            )
        spans.append((offset, length))
        end = offset + length + 1
    for token, what in ((rules.image_token_id, sum(lengths)),
                        (rules.start_id, count), (rules.end_id, count)):  # fmt: skip
        if sum(1 for t in ids if t == token) != what:
            raise InvalidRequest(
                f"{where}: the prompt holds token {token} outside the placeholders' spans"
            )
    return tuple(spans)


def read_images(mm: Any, ids: Sequence[int], rules: ImageRules | None) -> Images:
    """``mm`` (a ``MultimodalInputs``) for the prompt ``ids``, checked; InvalidRequest naming the
    field otherwise."""
    if rules is None:
        raise InvalidRequest(NOT_A_VISION_MODEL)
    if mm.video_urls or mm.audio_urls or mm.video_data or mm.audio_data:
        raise InvalidRequest("mm_inputs: video and audio are not served by this SGLang worker")
    other = sorted(set(mm.modalities) - {"image"})
    if other:
        raise InvalidRequest(f"mm_inputs.modalities: {', '.join(other)[:64]} is not served")
    if not mm.HasField("pixel_values"):
        raise InvalidRequest(
            "mm_inputs.pixel_values is required: this SGLang worker takes images the router "
            "preprocessed (image_urls and image_data are not fetched or decoded here)"
        )
    allowed = PATCH_TENSORS if rules.patch_features else ()
    stray = sorted(set(mm.model_specific_tensors) - set(allowed))
    if stray:
        raise InvalidRequest(
            f"mm_inputs.model_specific_tensors[{stray[0][:64]!r}]: not taken by this "
            f"{rules.family} model"
        )
    if mm.HasField("im_token_id") and mm.im_token_id != rules.image_token_id:
        raise InvalidRequest(
            f"mm_inputs.im_token_id {mm.im_token_id} is not this model's image token "
            f"({rules.image_token_id})"
        )
    pixels = read_tensor(mm.pixel_values, "mm_inputs.pixel_values")
    if rules.patch_features:
        grids = _patch_grids(mm, pixels, rules)
        lengths = [t * h * w // rules.merge**2 for t, h, w in grids]
        spans = _spans(mm.mm_placeholders, ids, lengths, rules)
        return Images(pixels, spans, rules, grids, tuple(int(t) for t in ids))
    count = _pixel_count(pixels, rules)
    lengths = [rules.tokens_per_image] * count
    return Images(pixels, _spans(mm.mm_placeholders, ids, lengths, rules), rules)


def _patch_grids(mm: Any, raw: RawTensor, rules: ImageRules) -> tuple[tuple[int, int, int], ...]:
    """A patch family's pictures: the pixels ``[patches, features]`` and each picture's
    ``image_grid_thw`` row, whose patches add up to the pixels' rows (``patches_per_image``, when
    sent, saying the same)."""
    where = "mm_inputs.pixel_values"
    if raw.dtype not in PIXEL_DTYPES:
        raise InvalidRequest(f"{where}: dtype {raw.dtype} is not one of {', '.join(PIXEL_DTYPES)}")
    if len(raw.shape) != 2 or raw.shape[1] != rules.patch_features:
        raise InvalidRequest(
            f"{where}: shape {list(raw.shape)} is not [patches, {rules.patch_features}] "
            f"(this {rules.family} model's flattened patches)"
        )
    name = "mm_inputs.model_specific_tensors['image_grid_thw']"
    if "image_grid_thw" not in mm.model_specific_tensors:
        raise InvalidRequest(f"{name} is required: each picture's patch grid")
    grid = read_tensor(mm.model_specific_tensors["image_grid_thw"], name)
    count = grid.shape[0] if len(grid.shape) == 2 else 0
    if grid.dtype not in ("int64", "int32") or len(grid.shape) != 2 or grid.shape[1] != 3:
        raise InvalidRequest(f"{name}: an integer tensor [images, 3] is taken")
    if not 1 <= count <= rules.max_images:
        raise InvalidRequest(f"{name}: {count} images; this worker takes 1 to {rules.max_images}")
    values = [int(v) for v in memoryview(grid.data).cast("q" if grid.dtype == "int64" else "i")]
    grids = tuple((values[3 * i], values[3 * i + 1], values[3 * i + 2]) for i in range(count))
    for i, (t, h, w) in enumerate(grids):
        if t < 1 or h < 1 or w < 1 or h % rules.merge or w % rules.merge:
            raise InvalidRequest(
                f"{name}[{i}]: ({t}, {h}, {w}) is not a grid of whole {rules.merge} x "
                f"{rules.merge} merges"
            )
    patches = [t * h * w for t, h, w in grids]
    if sum(patches) != raw.shape[0]:
        raise InvalidRequest(f"{where}: {raw.shape[0]} patches; the grids hold {sum(patches)}")
    if "patches_per_image" in mm.model_specific_tensors:
        per = "mm_inputs.model_specific_tensors['patches_per_image']"
        sent = read_tensor(mm.model_specific_tensors["patches_per_image"], per)
        ok = sent.dtype in ("int64", "int32") and list(sent.shape) == [count]
        code = "q" if sent.dtype == "int64" else "i"
        if not ok or [int(v) for v in memoryview(sent.data).cast(code)] != patches:
            raise InvalidRequest(f"{per}: not each picture's patch count ({patches})")
    return grids


#: What a language-only worker's encoders may be asked to load: the picture inline, or a web
#: address (SGLang's encoder fetches it, under its own rules); never a path on its host.
URL_SCHEMES = ("data:", "http://", "https://")
#: The longest address one picture may be (an inline picture is its data URL).
MAX_URL_CHARS = 16 << 20


def read_image_urls(
    mm: Any, ids: Sequence[int], image_token: int, max_images: int = MAX_IMAGES
) -> tuple[str, ...]:
    """A language-only worker's pictures (``mm_inputs.image_urls``), checked against the prompt
    ``ids``: SGLang's encoders compute them and its scheduler expands each ``image_token`` of the
    prompt into the picture's positions, so the prompt holds exactly one per picture, each after
    another token and none next to another (a prompt already expanded would be expanded again).
    InvalidRequest naming the field otherwise."""
    if mm.video_urls or mm.audio_urls or mm.video_data or mm.audio_data:
        raise InvalidRequest("mm_inputs: video and audio are not served by this SGLang worker")
    other = sorted(set(mm.modalities) - {"image"})
    if other:
        raise InvalidRequest(f"mm_inputs.modalities: {', '.join(other)[:64]} is not served")
    given = [
        name
        for name, present in (
            ("pixel_values", mm.HasField("pixel_values")),
            ("image_data", len(mm.image_data) > 0),
            ("model_specific_tensors", len(mm.model_specific_tensors) > 0),
        )
        if present
    ]
    if given:
        field = given[0]
        raise InvalidRequest(
            f"mm_inputs.{field}: a language-only worker takes mm_inputs.image_urls (its encoders "
            "compute the pictures)"
        )
    urls = tuple(str(u) for u in mm.image_urls)
    if not urls:
        raise InvalidRequest("mm_inputs.image_urls is required: this is a language-only worker")
    if len(urls) > max_images:
        raise InvalidRequest(f"mm_inputs.image_urls: {len(urls)} pictures, at most {max_images}")
    for index, url in enumerate(urls):
        if len(url) > MAX_URL_CHARS or not url.lower().startswith(URL_SCHEMES):
            raise InvalidRequest(
                f"mm_inputs.image_urls[{index}]: a data: or http(s) URL of at most "
                f"{MAX_URL_CHARS} characters is taken"
            )
    at = [i for i, token in enumerate(ids) if token == image_token]
    if len(at) != len(urls):
        raise InvalidRequest(
            f"input_ids: {len(at)} image token(s) ({image_token}) for {len(urls)} picture(s): "
            "one each"
        )
    if at and at[0] == 0:
        raise InvalidRequest("input_ids: an image token must follow another token")
    if any(b == a + 1 for a, b in itertools.pairwise(at)):
        raise InvalidRequest(
            "input_ids: two image tokens side by side (this worker expands each picture's "
            "token itself: send the prompt unexpanded)"
        )
    return urls

"""Multimodal requests, checked before any engine work. Engine-free (no vLLM, no torch).

Two ways images reach a vLLM worker (``GenerateRequest``):

- **preprocessed tensors** (the router's default): ``mm_inputs`` + ``extra_mm_inputs``, one
  ``MultimodalInputs`` batch each, built into vLLM's multimodal input by ``_mm_engine``;
- **media refs** (``--mm-processor inprocess``): ``media_refs.items`` in prompt order, each with
  exactly one unexpanded anchor token in ``tokenized.input_ids``; fetched and processed by vLLM.

Both kinds of work share one bound, :class:`MmGate` (``--mm-max-inflight``): a request that finds
it full is refused at once with UNAVAILABLE ("worker is saturated"), which the router retries on
another worker, instead of queueing without limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from smg_servicer_core.errors import InvalidRequest, Unavailable
from smg_servicer_vllm.mm_settings import MmSettings

#: ``Modality`` enum value of the wire -> vLLM's modality name (UNSPECIFIED means image).
MODALITY_NAMES: dict[int, str] = {0: "image", 1: "image", 2: "audio", 3: "video"}
REMOTE_SCHEMES = ("http", "https", "data")
#: The longest ``mm_hashes`` entry taken (the router's are 64 hex digits).
MAX_HASH_CHARS = 256


def batch_modality(batch: Any, where: str) -> tuple[str, int]:
    """A ``MultimodalInputs`` batch's modality name and item count (one per placeholder);
    InvalidRequest for an unknown modality or no placeholder."""
    modality = MODALITY_NAMES.get(int(batch.modality))
    if modality is None:
        raise InvalidRequest(f"{where}: modality {int(batch.modality)} is not supported")
    count = len(batch.mm_placeholders)
    if count == 0:
        raise InvalidRequest(f"{where}: mm_placeholders is empty")
    return modality, count


def check_hash_lengths(hashes: Sequence[str], where: str) -> None:
    """Every item hash is 1 to :data:`MAX_HASH_CHARS` characters."""
    for i, item_hash in enumerate(hashes):
        if not 0 < len(item_hash) <= MAX_HASH_CHARS:
            raise InvalidRequest(
                f"{where}.mm_hashes[{i}]: {len(item_hash)} characters; a hash has 1 to "
                f"{MAX_HASH_CHARS}"
            )


def placeholder_span(placeholder: Any, i: int, where: str, prompt_len: int) -> tuple[int, int]:
    """Item ``i``'s placeholder as ``(start, end)``, inside a ``prompt_len``-token prompt."""
    offset, length = int(placeholder.offset), int(placeholder.length)
    if length <= 0 or offset + length > prompt_len:
        raise InvalidRequest(
            f"{where}.mm_placeholders[{i}]: {offset}+{length} is outside the "
            f"{prompt_len}-token prompt"
        )
    return offset, offset + length


def check_apart(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The placeholders' spans in prompt order; InvalidRequest where two overlap."""
    ordered = sorted(spans)
    for (_, end), (start, _) in pairwise(ordered):
        if start < end:
            raise InvalidRequest("multimodal placeholders overlap")
    return ordered


@dataclass(frozen=True)
class MediaItem:
    modality: str
    url: str


class MmGate:
    """At most ``limit`` multimodal jobs at a time; the next one is refused, never queued."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    @contextlib.contextmanager
    def slot(self) -> Generator[None]:
        if self.active >= self.limit:
            raise Unavailable(
                f"worker is saturated: {self.active} multimodal jobs in flight "
                f"(--mm-max-inflight {self.limit}); retry on another worker"
            )
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


def has_tensors(request: Any) -> bool:
    return bool(request.HasField("mm_inputs") or len(request.extra_mm_inputs))


def accepted_schemes(local_media_allowed: bool) -> tuple[str, ...]:
    return (*REMOTE_SCHEMES, "file") if local_media_allowed else REMOTE_SCHEMES


def _data_bytes(url: str) -> int:
    """The approximate decoded size of a ``data:`` URL (base64: 3 bytes per 4 characters)."""
    _, _, payload = url.partition(",")
    return len(payload) * 3 // 4


def media_items(
    request: Any,
    settings: MmSettings,
    *,
    limits: Mapping[str, int],
    schemes: Sequence[str],
    anchors: Mapping[str, int],
) -> list[MediaItem]:
    """The request's media refs, checked: INVALID_ARGUMENT with the reason on any client fault.

    ``limits`` are the per-modality item limits (``--mm-max-items`` over the model's),
    ``schemes`` the accepted URL schemes and ``anchors`` the anchor token id per modality (the
    ones the model declares; the anchors' order in the prompt must be the items' order).
    """
    if settings.processor == "off":
        raise InvalidRequest(
            "media_refs sent but --mm-processor (SMG_VLLM_MM_PROCESSOR) is off on this worker; "
            "send preprocessed tensors, or start the worker with --mm-processor inprocess"
        )
    if has_tensors(request):
        raise InvalidRequest("media_refs and mm_inputs are mutually exclusive")
    if request.WhichOneof("input") != "tokenized":
        raise InvalidRequest("media_refs need tokenized input with one anchor token per item")
    refs = list(request.media_refs.items)
    if not refs:
        raise InvalidRequest("media_refs has no items")
    items: list[MediaItem] = []
    counts: dict[str, int] = {}
    for index, ref in enumerate(refs):
        where = f"media_refs.items[{index}]"
        modality = MODALITY_NAMES.get(int(ref.modality))
        if modality is None:
            raise InvalidRequest(f"{where}: modality {int(ref.modality)} is not supported")
        url = str(ref.url).strip()
        if not url:
            raise InvalidRequest(f"{where}: the url is empty")
        scheme = url.partition(":")[0].lower() if ":" in url else ""
        if scheme not in schemes:
            hint = (
                " (file: URLs need --allowed-local-media-path on the worker)"
                if scheme == "file"
                else ""
            )
            raise InvalidRequest(
                f"{where}: URL scheme {scheme or '(none)'!r} is not accepted; this worker "
                f"accepts {', '.join(schemes)}{hint}"
            )
        if scheme == "data" and _data_bytes(url) > settings.max_item_bytes:
            raise InvalidRequest(
                f"{where}: the inline data is about {_data_bytes(url)} bytes, over the "
                f"{settings.max_item_bytes}-byte limit (--mm-max-item-bytes)"
            )
        counts[modality] = counts.get(modality, 0) + 1
        limit = limits.get(modality, 0)
        if counts[modality] > limit:
            raise InvalidRequest(
                f"{where}: more than {limit} {modality} item(s) in one request"
                if limit
                else f"{where}: this model does not accept {modality} input"
            )
        items.append(MediaItem(modality, url))
    check_anchors(list(request.tokenized.input_ids), items, anchors)
    return items


def check_anchors(
    ids: Sequence[int], items: Sequence[MediaItem], anchors: Mapping[str, int]
) -> None:
    """One anchor token per item, in the items' order (for the modalities whose anchor is known)."""
    by_token = {token: modality for modality, token in anchors.items()}
    found = [by_token[t] for t in ids if t in by_token]
    expected = [item.modality for item in items if item.modality in anchors]
    if found == expected:
        return
    for modality, token in anchors.items():
        have, want = found.count(modality), expected.count(modality)
        if have != want:
            raise InvalidRequest(
                f"the prompt holds {have} {modality} anchor(s) (token {token}) for {want} "
                f"{modality} item(s); send one unexpanded anchor per item"
            )
    raise InvalidRequest(
        "the anchors in the prompt are not in the order of media_refs.items "
        f"(prompt: {', '.join(found)}; items: {', '.join(expected)})"
    )


@dataclass(frozen=True)
class MmFacts:
    """What the engine's model accepts, read once at start (by :mod:`._mm_engine`, for the
    orchestration in :mod:`.multimodal`)."""

    supported: bool = False
    limits: Mapping[str, int] = field(default_factory=dict[str, int])
    anchors: Mapping[str, int] = field(default_factory=dict[str, int])
    encoder_budget: int = 0
    max_embeds_per_item: Mapping[str, int] = field(default_factory=dict[str, int])
    #: vLLM's ``mm_device_do_normalize``: the engine normalizes pixels on its device.
    device_normalize: bool = False


def item_limits(
    model_limits: Mapping[str, int], override: Mapping[str, int] | None
) -> dict[str, int]:
    """Per-modality limits: ``--mm-max-items`` where given, else the model's."""
    limits = dict(model_limits)
    if override:
        for modality, count in override.items():
            if modality in limits:
                limits[modality] = count
    return limits


def format_limits(limits: Mapping[str, int]) -> str:
    """``image=2,video=999`` (the ``mm_item_limits`` label), modalities with a non-zero limit."""
    return ",".join(f"{m}={n}" for m, n in limits.items() if n > 0)


def _names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


class MediaRefused(InvalidRequest):
    """A fetch that failed by the request's fault. ``reason`` is the sidecar protocol's code
    (``fetch_failed``, ``domain_not_allowed`` or ``decode_failed``). A host refused by the
    address rules (:mod:`.media_guard`) is ``domain_not_allowed`` too: a client code every
    worker already maps to INVALID_ARGUMENT, where a new code would read as retryable
    UNAVAILABLE to a worker older than its sidecar."""

    def __init__(self, message: str, reason: str = "fetch_failed") -> None:
        super().__init__(message)
        self.reason = reason


class MediaUnavailable(Unavailable):
    """A fetch that may succeed later (a media host's 5xx, a timeout, no connection)."""

    reason = "fetch_unavailable"


def fetch_error(exc: BaseException, where: str, modality: str) -> MediaRefused | MediaUnavailable:  # noqa: PLR0911 - one answer per failure class
    """A fetch failure as the client should see it, by exception class (no raw text: a message
    can hold a server path or an allow-list). Client faults -> INVALID_ARGUMENT; timeouts,
    upstream 5xx/408/429 and connection failures -> UNAVAILABLE (the router may retry). Both
    carry the sidecar protocol's code as ``reason``."""
    names = _names(exc)
    text = str(exc)
    if "MediaHostRefused" in names:  # media_guard's refusal: its detail is client-safe
        detail = str(getattr(exc, "detail", "") or "the URL's host is refused")
        return MediaRefused(f"{where}: {detail}", "domain_not_allowed")
    if "ClientResponseError" in names:
        status = int(getattr(exc, "status", 0) or 0)
        message = f"{where}: the media host answered HTTP {status}"
        return (
            MediaUnavailable(message)
            if status >= 500 or status in (408, 429)
            else MediaRefused(message)
        )
    if "VLLMClientError" in names:
        status = "".join(ch for ch in text.partition("HTTP ")[2][:3] if ch.isdigit())
        detail = f"the media host answered HTTP {status}" if status else "the URL is not valid"
        return MediaRefused(f"{where}: {detail}")
    if "TimeoutError" in names:
        return MediaUnavailable(f"{where}: fetching the {modality} timed out")
    if "ClientError" in names:  # aiohttp: DNS, refused connection, reset, ...
        return MediaUnavailable(f"{where}: the media host could not be reached")
    if "NotImplementedError" in names:
        return MediaRefused(f"{where}: only base64 data: URLs are supported")
    if "FileNotFoundError" in names or "IsADirectoryError" in names:
        return MediaRefused(f"{where}: the file does not exist")
    if "ValueError" in names and "allowed domains" in text:
        return MediaRefused(
            f"{where}: the URL's host is not in --allowed-media-domains", "domain_not_allowed"
        )
    if "ValueError" in names and "allowed-local-media-path" in text:
        return MediaRefused(f"{where}: the file is outside --allowed-local-media-path")
    if "ValueError" in names or "UnidentifiedImageError" in names or "OSError" in names:
        return MediaRefused(f"{where}: the media could not be read as {modality}", "decode_failed")
    return MediaUnavailable(f"{where}: the {modality} could not be fetched")

"""``--mm-processor redis``: media refs processed by the GPU-free sidecar over Redis.

Both sides import this module: :func:`fingerprint_of` derives the protocol fingerprint from a
vLLM ``ModelConfig`` (the worker's engine, the sidecar's config), and :func:`encode_item` /
:func:`decode_item` are the two ends of a ``MultiModalKwargsItem`` blob (vLLM's own msgpack
codec, every tensor inline, no pickle). :class:`RedisProcessor` is the worker's processor: it
submits a job through :class:`smg_servicer_mm_sidecar.client.SidecarClient`, checks the result
(fingerprint, counts, placeholder spans, ids) and rebuilds vLLM's engine input with the model's
float dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import vllm
import vllm.envs as vllm_envs
from vllm.inputs.engine import mm_input
from vllm.multimodal.inputs import MultiModalKwargsItem, MultiModalKwargsItems, PlaceholderRange
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from smg_servicer_core import validate
from smg_servicer_core.errors import ConfigError, InvalidRequest, ServicerError, Unavailable
from smg_servicer_mm_sidecar.protocol import (
    MODALITIES,
    SIDECAR_PROTOCOL,
    Fingerprint,
    JobItem,
    JobResult,
    Placeholder,
    SidecarError,
    client_message,
    limit_string,
    sorted_json,
)
from smg_servicer_vllm.mm import MediaItem, accepted_schemes
from smg_servicer_vllm.mm_settings import MmSettings, redact_url

logger = logging.getLogger(__name__)
#: Every tensor inline in the one buffer (vLLM's out-of-band buffers would need a side channel).
_INLINE = 2**62


def fingerprint_of(model_config: Any) -> Fingerprint:
    """The protocol fingerprint of a vLLM model configuration. The limits are vLLM's resolved
    per-modality counts (``{"image": 2}`` and ``{"image": {"count": 2}}`` agree)."""
    mm = model_config.multimodal_config
    given: Mapping[str, Any] = getattr(mm, "limit_per_prompt", None) or {}
    off = bool(getattr(mm, "language_model_only", False))
    limits: dict[str, int | None] = {
        m: 0 if off else (int(mm.get_limit_per_prompt(m)) if m in given else None)
        for m in MODALITIES
    }
    return Fingerprint(
        model=str(model_config.model),
        vllm_version=str(vllm.__version__),
        dtype=str(model_config.dtype).removeprefix("torch."),
        video_backend=str(vllm_envs.VLLM_VIDEO_LOADER_BACKEND),
        media_io_kwargs=sorted_json(getattr(mm, "media_io_kwargs", None)),
        mm_processor_kwargs=sorted_json(getattr(mm, "mm_processor_kwargs", None)),
        limit_per_prompt=limit_string(limits),
    )


def encode_item(item: Any) -> bytes:
    """One ``MultiModalKwargsItem`` as one msgpack buffer."""
    buffers = MsgpackEncoder(size_threshold=_INLINE).encode(item)
    if len(buffers) != 1:
        raise ValueError("the item did not encode into one buffer")
    return bytes(buffers[0])  # pyright: ignore[reportArgumentType]


@functools.cache
def _decoder() -> MsgpackDecoder:
    return MsgpackDecoder(MultiModalKwargsItem)


def decode_item(blob: bytes, dtype: torch.dtype) -> Any:
    """The item back, its floating tensors cast to ``dtype`` (the worker's model dtype)."""
    item = _decoder().decode(bytearray(blob))  # writable: vLLM may move or cast in place
    if not isinstance(item, MultiModalKwargsItem):
        raise ValueError("the blob is not a MultiModalKwargsItem")
    for key, elem in list(item.items()):
        data = elem.data
        if isinstance(data, torch.Tensor) and data.is_floating_point() and data.dtype != dtype:
            item[key] = dataclasses.replace(elem, data=data.to(dtype))
    return item


def as_servicer_error(exc: SidecarError) -> ServicerError:
    message = client_message(exc.code, exc.message)
    if exc.status == "INVALID_ARGUMENT":
        return InvalidRequest(message)
    if exc.status == "INTERNAL":  # a timeout: the router must not spend the budget again
        return ServicerError(message)
    return Unavailable(message)


class RedisProcessor:
    """Media refs sent to the sidecar; its tensors rebuilt into vLLM's engine input."""

    def __init__(
        self,
        engine: Any,
        settings: MmSettings,
        dtype: torch.dtype,
        max_embeds: Mapping[str, int] | None = None,
    ) -> None:
        """``max_embeds``: the most embedding positions one item of a modality fills (vLLM's
        per-item maximum): a result that places more would fail inside the engine."""
        try:
            from smg_servicer_mm_sidecar.client import SidecarClient, connect  # noqa: PLC0415

            redis = connect(settings.redis_url)
        except ImportError as exc:
            raise ConfigError(
                "--mm-processor redis needs the Redis client: "
                "pip install 'smg-servicer-vllm[redis]'"
            ) from exc
        mc = engine.model_config
        self.vocab_size = int(mc.get_vocab_size())
        self.context_length = int(mc.max_model_len)
        self.dtype = dtype
        self.max_embeds = dict(max_embeds or {})
        self.client = SidecarClient(
            redis,
            fingerprint_of(mc),
            namespace=settings.sidecar_namespace,
            timeout_ms=settings.sidecar_timeout_ms,
            max_queue=settings.sidecar_max_queue,
        )
        logger.info(
            "multimodal sidecar: Redis %s, namespace %s (%s), timeout %d ms, max queue %d",
            redact_url(settings.redis_url),
            self.client.namespace,
            "given" if settings.sidecar_namespace else "derived",
            settings.sidecar_timeout_ms,
            settings.sidecar_max_queue,
        )

    @property
    def schemes(self) -> tuple[str, ...]:
        """The schemes the live sidecar accepts; every scheme until one is found (the sidecar
        then answers ``scheme_not_accepted`` itself)."""
        return self.client.hello.schemes if self.client.hello else accepted_schemes(True)

    @property
    def advertised(self) -> bool:
        """Whether the last probe found a sidecar with our fingerprint."""
        return self.client.advertised

    async def refresh(self) -> None:
        """Probe the sidecar's hello again (at most once a second)."""
        await self.client.probe()

    async def engine_input(
        self, ids: list[int], items: Sequence[MediaItem], text: str, request_id: str = ""
    ) -> Any:
        jobs = [JobItem(modality=i.modality, url=i.url) for i in items]
        started = time.time()
        try:
            result = await self.client.submit(request_id, ids, text or None, jobs)
            return self._engine_input(result, len(items), text, started)
        except SidecarError as exc:
            logger.info("request %s: the sidecar answered %s", request_id, exc.code)
            raise as_servicer_error(exc) from None

    def _engine_input(self, result: JobResult, count: int, text: str, started: float) -> Any:
        ids = list(result.prompt_token_ids)
        validate.prompt(ids, self.vocab_size, self.context_length)
        kwargs: dict[str, list[Any]] = {}
        placeholders: dict[str, list[PlaceholderRange]] = {}
        hashes: dict[str, list[str]] = {}
        for modality, blobs in result.mm_kwargs.items():
            ranges = result.mm_placeholders.get(modality, [])
            names = result.mm_hashes.get(modality, [])
            if modality not in MODALITIES or not (len(blobs) == len(ranges) == len(names)):
                raise SidecarError(SIDECAR_PROTOCOL, f"the {modality} result is inconsistent")
            limit = self.max_embeds.get(modality)
            placeholders[modality] = [self._range(p, len(ids), limit) for p in ranges]
            try:
                kwargs[modality] = [decode_item(b, self.dtype) for b in blobs]
            except Exception as exc:  # msgspec, torch or vLLM's decoder: a broken result
                raise SidecarError(SIDECAR_PROTOCOL, "the result's tensors are unreadable") from exc
            hashes[modality] = list(names)
        if sum(len(v) for v in kwargs.values()) != count:
            raise SidecarError(SIDECAR_PROTOCOL, "the result holds the wrong number of items")
        engine_input = mm_input(
            ids,
            MultiModalKwargsItems(kwargs),
            hashes,
            placeholders,  # pyright: ignore[reportArgumentType]
            prompt=text or None,
        )
        engine_input["arrival_time"] = started  # pyright: ignore[reportGeneralTypeIssues]
        return engine_input

    @staticmethod
    def _range(placeholder: Any, prompt_len: int, max_embeds: int | None) -> PlaceholderRange:
        offset, length = int(placeholder.offset), int(placeholder.length)
        mask = placeholder.is_embed
        if length <= 0 or offset < 0 or offset + length > prompt_len:
            raise SidecarError(SIDECAR_PROTOCOL, "a placeholder lies outside the prompt")
        if mask is not None and len(mask) != length:
            raise SidecarError(SIDECAR_PROTOCOL, "a placeholder's embed mask has the wrong size")
        embeds = sum(mask) if mask is not None else length
        if max_embeds is not None and embeds > max_embeds:
            raise SidecarError(SIDECAR_PROTOCOL, "a placeholder is longer than the model's items")
        is_embed = torch.tensor(mask, dtype=torch.bool) if mask is not None else None
        return PlaceholderRange(offset=offset, length=length, is_embed=is_embed)

    async def aclose(self) -> None:
        await self.client.aclose()


def result_fields(engine_input: Mapping[str, Any]) -> dict[str, Any]:
    """The sidecar's half: vLLM's processed input -> the ``JobResult`` fields."""
    placeholders: dict[str, list[Placeholder]] = {}
    for modality, ranges in engine_input["mm_placeholders"].items():
        placeholders[modality] = [
            Placeholder(
                offset=int(r.offset),
                length=int(r.length),
                is_embed=None if r.is_embed is None else [bool(x) for x in r.is_embed.tolist()],
            )
            for r in ranges
        ]
    return {
        "prompt_token_ids": list(engine_input["prompt_token_ids"]),
        "mm_hashes": {m: [str(h) for h in hs] for m, hs in engine_input["mm_hashes"].items()},
        "mm_placeholders": placeholders,
        "mm_kwargs": {
            m: [encode_item(item) for item in items]
            for m, items in engine_input["mm_kwargs"].items()
        },
    }

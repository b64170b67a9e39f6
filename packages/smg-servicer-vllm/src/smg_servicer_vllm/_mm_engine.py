"""Multimodal engine inputs, built with vLLM's own types (imports vLLM and torch).

- :func:`tensor_input`: the router's preprocessed batches (``mm_inputs`` + ``extra_mm_inputs``)
  -> ``vllm.inputs.engine.mm_input(...)``: every tensor read and checked by core's
  ``read_tensor`` (inline or shared memory, read then unlinked), floating tensors cast to the
  model dtype, field layouts from the batch's keys (``batched_keys`` -> batched, ``flat_keys`` ->
  flat from the sizes tensor, others shared), placeholders with the embed mask of
  ``im_token_id``. vLLM's renderer is bypassed: the router already expanded the prompt.
- :class:`InprocessProcessor`: media refs fetched with vLLM's media connector (the engine's
  ``--allowed-media-domains``, ``--allowed-local-media-path``, ``--media-io-kwargs`` and
  ``VLLM_*_FETCH_TIMEOUT``), then expanded and processed by vLLM's renderer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import torch
import vllm.envs as vllm_envs
from vllm.inputs.engine import mm_input
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems, PlaceholderRange
from vllm.multimodal.media.connector import MEDIA_CONNECTOR_REGISTRY

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.tensors import (
    MAX_TENSOR_BYTES,
    RawTensor,
    read_tensor,
    release_shm,
    shm_namespace_id,
)
from smg_servicer_vllm.mm import (
    MODALITY_NAMES,
    MediaItem,
    MmGate,
    accepted_schemes,
    fetch_error,
    format_limits,
    has_tensors,
    item_limits,
    media_items,
)
from smg_servicer_vllm.mm_settings import MmSettings

if TYPE_CHECKING:
    from smg_servicer_vllm.mm_redis import RedisProcessor

logger = logging.getLogger(__name__)

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def to_torch(raw: RawTensor) -> torch.Tensor:
    if raw.nbytes == 0:
        return torch.empty(raw.shape, dtype=_TORCH_DTYPES.get(raw.dtype, torch.int64))
    buffer = bytearray(raw.data)  # writable: vLLM may move or cast in place
    if raw.dtype == "uint32":  # torch's uint32 has few kernels; the values fit int64
        return torch.frombuffer(buffer, dtype=torch.uint32).to(torch.int64).reshape(raw.shape)
    return torch.frombuffer(buffer, dtype=_TORCH_DTYPES[raw.dtype]).reshape(raw.shape)


def _placeholders(
    batch: Any, where: str, ids: Sequence[int], count: int, max_embeds: int | None
) -> list[PlaceholderRange]:
    ranges: list[PlaceholderRange] = []
    token = int(batch.im_token_id) if batch.HasField("im_token_id") else None
    for i, placeholder in enumerate(batch.mm_placeholders):
        offset, length = int(placeholder.offset), int(placeholder.length)
        if length <= 0 or offset + length > len(ids):
            raise InvalidRequest(
                f"{where}.mm_placeholders[{i}]: {offset}+{length} is outside the "
                f"{len(ids)}-token prompt"
            )
        is_embed = None
        if token is not None:
            window = torch.tensor(ids[offset : offset + length])
            mask = window == token
            if not bool(mask.any()):
                raise InvalidRequest(
                    f"{where}.mm_placeholders[{i}]: the range holds no im_token_id {token}"
                )
            if not bool(mask.all()):
                is_embed = mask
        embeds = int(is_embed.sum()) if is_embed is not None else length
        if max_embeds is not None and embeds > max_embeds:
            # More positions than the encoder fills would fail inside the engine and kill it.
            raise InvalidRequest(
                f"{where}.mm_placeholders[{i}]: {embeds} embedding positions, more than the "
                f"{max_embeds} this model produces for one item"
            )
        ranges.append(PlaceholderRange(offset=offset, length=length, is_embed=is_embed))
    if len(ranges) != count:
        raise InvalidRequest(f"{where}: {len(ranges)} placeholders for {count} items")
    return ranges


def _tensors(batch: Any, where: str, modality: str, model_dtype: torch.dtype) -> dict[str, Any]:
    if not batch.HasField("pixel_values"):
        raise InvalidRequest(f"{where}: pixel_values is missing")
    key = batch.encoder_input_key or "pixel_values"
    if modality == "video" and key == "pixel_values":
        key = "pixel_values_videos"
    tensors = {key: to_torch(read_tensor(batch.pixel_values, f"{where}.pixel_values"))}
    total = tensors[key].numel() * tensors[key].element_size()
    for name in sorted(batch.model_specific_tensors):
        if name in tensors:
            raise InvalidRequest(f"{where}: tensor {name!r} is given twice")
        tensors[name] = to_torch(read_tensor(batch.model_specific_tensors[name], f"{where}.{name}"))
        total += tensors[name].numel() * tensors[name].element_size()
        if total > MAX_TENSOR_BYTES:
            raise InvalidRequest(f"{where}: the tensors are over {MAX_TENSOR_BYTES} bytes")
    return {
        name: t.to(model_dtype) if t.is_floating_point() and t.dtype != model_dtype else t
        for name, t in tensors.items()
    }


def _field_config(
    batch: Any, where: str, modality: str, tensors: Mapping[str, Any], count: int
) -> dict[str, Any]:
    """vLLM's field layout per tensor: ``flat_keys`` -> flat from the named sizes tensor,
    ``batched_keys`` -> batched, anything else shared by the batch's items."""
    batched, keep = set(batch.batched_keys), set(batch.keep_on_cpu_keys)
    config: dict[str, Any] = {}
    for name in tensors:
        on_cpu = name in keep
        if name in batch.flat_keys:
            sizes = tensors.get(batch.flat_keys[name])
            if sizes is None or sizes.is_floating_point():
                raise InvalidRequest(
                    f"{where}: flat key {name!r} names sizes tensor "
                    f"{batch.flat_keys[name]!r}, which is missing or not an integer tensor"
                )
            config[name] = MultiModalFieldConfig.flat_from_sizes(
                modality, sizes.reshape(-1), keep_on_cpu=on_cpu
            )
        elif name in batched:
            config[name] = MultiModalFieldConfig.batched(modality, keep_on_cpu=on_cpu)
        else:
            config[name] = MultiModalFieldConfig.shared(modality, count, keep_on_cpu=on_cpu)
    return config


def _batch(
    batch: Any,
    where: str,
    ids: Sequence[int],
    facts: _TensorFacts,
    request_id: str,
) -> tuple[str, list[Any], list[str], list[PlaceholderRange]]:
    modality = MODALITY_NAMES.get(int(batch.modality))
    if modality is None:
        raise InvalidRequest(f"{where}: modality {int(batch.modality)} is not supported")
    count = len(batch.mm_placeholders)
    if count == 0:
        raise InvalidRequest(f"{where}: mm_placeholders is empty")
    tensors = _tensors(batch, where, modality, facts.dtype)
    config = _field_config(batch, where, modality, tensors, count)
    try:
        split = MultiModalKwargsItems.from_hf_inputs(tensors, config)  # pyright: ignore[reportArgumentType]
        items = list(split.get(modality, []))
    except (ValueError, IndexError, RuntimeError, TypeError) as exc:
        raise InvalidRequest(f"{where}: the tensors do not split into {count} items") from exc
    if len(items) != count:
        raise InvalidRequest(
            f"{where}: the tensors hold {len(items)} items for {count} placeholders"
        )
    hashes = [str(h) for h in batch.mm_hashes] or [
        f"{request_id}:{modality}:{where}:{i}" for i in range(count)
    ]
    if len(hashes) != count:
        raise InvalidRequest(f"{where}: {len(hashes)} mm_hashes for {count} items")
    ranges = _placeholders(batch, where, ids, count, facts.max_embeds.get(modality))
    return modality, items, hashes, ranges


@dataclass(frozen=True)
class _TensorFacts:
    dtype: torch.dtype
    #: The most embedding positions one item of a modality fills (vLLM's encoder budget).
    max_embeds: Mapping[str, int]


def tensor_input(request: Any, ids: list[int], facts: _TensorFacts) -> Any:
    """The engine input of a request with ``mm_inputs`` / ``extra_mm_inputs``."""
    batches = [("mm_inputs", request.mm_inputs)] if request.HasField("mm_inputs") else []
    batches += [(f"extra_mm_inputs[{i}]", b) for i, b in enumerate(request.extra_mm_inputs)]
    kwargs: dict[str, list[Any]] = {}
    hashes: dict[str, list[str]] = {}
    placeholders: dict[str, list[PlaceholderRange]] = {}
    for where, batch in batches:
        modality, items, item_hashes, ranges = _batch(batch, where, ids, facts, request.request_id)
        kwargs.setdefault(modality, []).extend(items)
        hashes.setdefault(modality, []).extend(item_hashes)
        placeholders.setdefault(modality, []).extend(ranges)
    spans = sorted((r.offset, r.offset + r.length) for rs in placeholders.values() for r in rs)
    for (_, end), (start, _) in pairwise(spans):
        if start < end:
            raise InvalidRequest("multimodal placeholders overlap")
    text = request.tokenized.original_text if request.WhichOneof("input") == "tokenized" else ""
    return mm_input(
        ids,
        MultiModalKwargsItems(kwargs),
        hashes,
        placeholders,  # pyright: ignore[reportArgumentType]
        prompt=text or None,
    )


class InprocessProcessor:
    """Media refs fetched and processed inside the worker (``--mm-processor inprocess``)."""

    def __init__(self, engine: Any, settings: MmSettings) -> None:
        """``engine``: anything with vLLM's ``model_config`` and ``renderer`` (an ``AsyncLLM``,
        or the sidecar's config and renderer)."""
        mc = engine.model_config
        mm_config = getattr(mc, "multimodal_config", None)
        configured: Mapping[str, Mapping[str, Any]] = (
            getattr(mm_config, "media_io_kwargs", None) or {}
        )
        media_io_kwargs = {k: dict(v) for k, v in configured.items()}
        if settings.max_video_frames:
            video = media_io_kwargs.setdefault("video", {})
            current = int(video.get("num_frames", 0) or 0)
            video["num_frames"] = (
                min(current, settings.max_video_frames)
                if current > 0
                else settings.max_video_frames
            )
        self.renderer = engine.renderer
        self.local_media_allowed = bool(getattr(mc, "allowed_local_media_path", ""))
        domains = getattr(mc, "allowed_media_domains", None)
        if not domains:
            logger.warning(
                "--mm-processor %s without --allowed-media-domains: the worker fetches media "
                "from any host the router forwards",
                settings.processor,
            )
        self.connector = MEDIA_CONNECTOR_REGISTRY.load(  # pyright: ignore[reportUnknownMemberType]
            vllm_envs.VLLM_MEDIA_CONNECTOR,
            media_io_kwargs=media_io_kwargs,
            allowed_local_media_path=getattr(mc, "allowed_local_media_path", "") or "",
            allowed_media_domains=domains,
        )

    @property
    def schemes(self) -> tuple[str, ...]:
        return accepted_schemes(self.local_media_allowed)

    #: The worker processes media itself: always able to.
    advertised = True

    async def refresh(self) -> None:
        """Nothing changes while serving."""

    async def aclose(self) -> None:
        """Nothing to close."""

    async def _fetch_one(self, index: int, item: MediaItem) -> Any:
        where = f"media_refs.items[{index}]"
        fetch = {
            "image": self.connector.fetch_image_async,
            "video": self.connector.fetch_video_async,
            "audio": self.connector.fetch_audio_async,
        }[item.modality]
        try:
            return await fetch(item.url)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            mapped = fetch_error(exc, where, item.modality)
            logger.info("%s: %s fetch failed (%s)", where, item.modality, type(exc).__name__)
            raise mapped from exc

    async def fetch(self, items: Sequence[MediaItem]) -> dict[str, list[Any]]:
        """Fetch every item concurrently (the first failure cancels the rest): the media per
        modality, in request order."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._fetch_one(i, item)) for i, item in enumerate(items)
                ]
        except ExceptionGroup as failed:  # the first item's failure is the answer
            raise failed.exceptions[0] from None
        data: dict[str, list[Any]] = {}
        for item, task in zip(items, tasks, strict=True):
            data.setdefault(item.modality, []).append(task.result())
        return data

    async def process(self, ids: list[int], data: Mapping[str, list[Any]], text: str) -> Any:
        """vLLM's renderer expands the anchors and runs the processor: the engine input."""
        prompt: dict[str, Any] = {
            "prompt_token_ids": ids,
            "multi_modal_data": {m: v[0] if len(v) == 1 else v for m, v in data.items()},
        }
        if text:
            prompt["prompt"] = text
        try:
            return await self.renderer.process_for_engine_async(
                prompt, time.time(), skip_mm_cache=True
            )
        except (RuntimeError, ValueError) as exc:
            logger.info("media processing refused the request (%s)", type(exc).__name__)
            raise InvalidRequest(
                "the media do not match the prompt's anchors or the model's limits"
            ) from exc

    async def engine_input(
        self, ids: list[int], items: Sequence[MediaItem], text: str, request_id: str = ""
    ) -> Any:
        return await self.process(ids, await self.fetch(items), text)


def model_dtype(engine: Any) -> torch.dtype:
    dtype = getattr(engine.model_config, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


@dataclass(frozen=True)
class MmFacts:
    """What the engine's model accepts, read once at start."""

    supported: bool = False
    limits: Mapping[str, int] = field(default_factory=dict[str, int])
    anchors: Mapping[str, int] = field(default_factory=dict[str, int])
    encoder_budget: int = 0
    max_embeds_per_item: Mapping[str, int] = field(default_factory=dict[str, int])


def mm_facts(engine: Any) -> MmFacts:
    """The model's multimodal facts; a text model (or ``--language-model-only``) has none."""
    mc = engine.model_config
    if not getattr(mc, "supports_multimodal_inputs", False):
        return MmFacts()
    processor = MULTIMODAL_REGISTRY.create_processor(mc)
    limits = {m: int(n) for m, n in processor.info.allowed_mm_limits.items() if n}
    try:  # the module moved between vLLM releases; the label is informative only
        from vllm.multimodal.encoder_budget import MultiModalBudget  # noqa: PLC0415

        counted = MultiModalBudget(engine.vllm_config, MULTIMODAL_REGISTRY, enable_cache=False)
        budget = int(counted.get_encoder_budget())
        max_embeds = {m: int(n) for m, n in getattr(counted, "mm_max_toks_per_item", {}).items()}
    except ImportError:
        budget, max_embeds = 0, {}
    return MmFacts(
        supported=True,
        limits=limits,
        anchors=_anchor_tokens(getattr(mc, "hf_config", None)),
        encoder_budget=budget,
        max_embeds_per_item=max_embeds,
    )


def _anchor_tokens(hf: Any) -> dict[str, int]:
    """The anchor token id per modality that the model's config declares."""
    anchors: dict[str, int] = {}
    for modality in ("image", "video", "audio"):
        for name in (f"{modality}_token_id", f"{modality}_token_index"):
            value = getattr(hf, name, None)
            if isinstance(value, int) and value >= 0:
                anchors[modality] = value
                break
    return anchors


class MultimodalPath:
    """A request's multimodal input -> vLLM's engine input, under the ``--mm-max-inflight`` gate."""

    def __init__(self, engine: Any, settings: MmSettings) -> None:
        self.settings = settings
        try:
            self.facts = mm_facts(engine)
        except Exception:  # a model vLLM cannot build a processor for: serve text only
            logger.warning("the model's multimodal processor could not be built; serving text")
            self.facts = MmFacts()
        self.mode = settings.processor
        if self.mode != "off" and not self.facts.supported:
            logger.info(
                "--mm-processor %s is ignored: the model accepts no media; processing stays off",
                self.mode,
            )
            self.mode = "off"
        self.limits = item_limits(self.facts.limits, settings.max_items)
        self.tensor_facts = _TensorFacts(model_dtype(engine), self.facts.max_embeds_per_item)
        self.gate = MmGate(settings.max_inflight)
        self.processor: InprocessProcessor | RedisProcessor | None = None
        if self.mode == "inprocess":
            self.processor = InprocessProcessor(engine, settings)
        elif self.mode == "redis":
            from smg_servicer_vllm.mm_redis import RedisProcessor  # noqa: PLC0415

            self.processor = RedisProcessor(
                engine, settings, self.tensor_facts.dtype, self.facts.max_embeds_per_item
            )

    @property
    def schemes(self) -> tuple[str, ...]:
        """The URL schemes media refs may use: the live sidecar's, or the worker's own."""
        return self.processor.schemes if self.processor is not None else accepted_schemes(False)

    async def refresh(self) -> None:
        """Re-read what may change while serving (whether the sidecar is alive)."""
        if self.processor is not None:
            await self.processor.refresh()

    @property
    def advertised(self) -> bool:
        """Whether media refs can be processed now (``mm_processor`` is advertised)."""
        return self.processor is not None and self.processor.advertised

    def check(self, request: Any) -> list[MediaItem]:
        """The cheap checks of a multimodal request (no fetch, no tensor read): its media refs."""
        if not self.facts.supported:
            raise InvalidRequest("this model accepts no multimodal input")
        if not request.HasField("media_refs"):
            return []
        return media_items(
            request,
            self.settings,
            limits=self.limits,
            schemes=self.schemes,
            anchors=self.facts.anchors,
        )

    async def engine_input(self, request: Any, ids: list[int]) -> Any | None:
        """The engine input for a multimodal request, or None for a text request."""
        if not (request.HasField("media_refs") or has_tensors(request)):
            return None
        items = self.check(request)
        if items:
            assert self.processor is not None  # processing is on (media_items checked)
            with self.gate.slot():
                return await self.processor.engine_input(
                    ids, items, request.tokenized.original_text, request.request_id
                )
        with self.gate.slot():
            return await asyncio.to_thread(tensor_input, request, ids, self.tensor_facts)

    async def aclose(self) -> None:
        """Close the processor's connections (the sidecar's Redis client)."""
        if self.processor is not None:
            await self.processor.aclose()

    @staticmethod
    def release(request: Any) -> None:
        """Free the shared-memory tensors of a request refused as the client's fault."""
        batches = [request.mm_inputs] if request.HasField("mm_inputs") else []
        batches += list(request.extra_mm_inputs)
        if batches:
            release_shm(
                tensor
                for batch in batches
                for tensor in (batch.pixel_values, *batch.model_specific_tensors.values())
            )

    def server_info(self) -> dict[str, Any]:
        """The ``GetServerInfo`` multimodal labels."""
        fields: dict[str, Any] = {
            "shm_namespace_id": shm_namespace_id(),
            "mm_item_limits": format_limits(self.limits),
            "mm_encoder_budget": self.facts.encoder_budget,
        }
        if self.advertised:
            fields |= {
                "mm_processor": self.mode,
                "mm_media_ref_schemes": ",".join(self.schemes),
                "mm_processor_source": self.settings.source,
            }
        return fields

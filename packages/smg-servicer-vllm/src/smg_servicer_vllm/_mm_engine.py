"""The multimodal engine side: everything built with vLLM's own types (imports vLLM and torch).

The orchestration (:class:`~smg_servicer_vllm.multimodal.MultimodalPath`: plan, gate, processor)
and the sidecar's protocol handling are engine-free; they call in here for:

- :func:`tensor_input`: the router's preprocessed batches (``mm_inputs`` + ``extra_mm_inputs``)
  -> ``vllm.inputs.engine.mm_input(...)``: every tensor read and checked by core's
  ``read_tensor`` (inline or shared memory, read then unlinked), floating tensors cast to the
  model dtype, field layouts from the batch's keys (``batched_keys`` -> batched, ``flat_keys`` ->
  flat from the sizes tensor, others shared), placeholders with the embed mask of
  ``im_token_id``. vLLM's renderer is bypassed: the router already expanded the prompt.
- :class:`InprocessProcessor`: media refs fetched with vLLM's media connector (the engine's
  ``--allowed-media-domains``, ``--allowed-local-media-path``, ``--media-io-kwargs`` and
  ``VLLM_*_FETCH_TIMEOUT``) over our guarded HTTP connection (:mod:`.media_guard`: private
  hosts refused on the resolved address, every redirect checked), then expanded and processed
  by vLLM's renderer (the worker's ``--mm-processor inprocess``, and the sidecar's processing).
- :func:`mm_facts`: what the model accepts, read once at start.
- the sidecar's vLLM pieces: :func:`fingerprint_of` (the protocol fingerprint of a
  ``ModelConfig``), the ``MultiModalKwargsItem`` blob codec (:func:`encode_item`,
  :func:`decode_items`: vLLM's own msgpack codec, every tensor inline, no pickle),
  :func:`sidecar_input` (a sidecar result as vLLM's engine input) and the sidecar process's
  parser and renderer (:func:`sidecar_parser`, :func:`sidecar_renderer`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import vllm
import vllm.envs as vllm_envs
from vllm.connections import HTTPConnection
from vllm.inputs.engine import mm_input
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import (
    MultiModalFieldConfig,
    MultiModalKwargsItem,
    MultiModalKwargsItems,
    PlaceholderRange,
)
from vllm.multimodal.media.connector import MEDIA_CONNECTOR_REGISTRY
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.tensors import MAX_TENSOR_BYTES, RawTensor, read_tensor
from smg_servicer_mm_sidecar.protocol import MODALITIES, Fingerprint, limit_string, sorted_json
from smg_servicer_vllm import mm, releases
from smg_servicer_vllm._mm_layouts import ItemLayout, item_layouts
from smg_servicer_vllm.media_guard import OPT_IN_FLAG, AddressPolicy, GuardedFetcher
from smg_servicer_vllm.mm import (
    MediaItem,
    MmFacts,
    accepted_schemes,
    fetch_error,
)
from smg_servicer_vllm.mm_settings import MmSettings

logger = logging.getLogger(__name__)
#: Every tensor inline in the one buffer (vLLM's out-of-band buffers would need a side channel).
_INLINE = 2**62

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
    batch: Any,
    where: str,
    ids: Sequence[int],
    expected: Sequence[int | None],
    max_embeds: int | None,
) -> list[PlaceholderRange]:
    """One range per item, checked: inside the prompt, its embedding positions (``im_token_id``
    positions, or the whole range without one) exactly what the encoder makes of the item
    (``expected``, None where the model gives no way to know) and at most ``max_embeds``."""
    ranges: list[PlaceholderRange] = []
    token = int(batch.im_token_id) if batch.HasField("im_token_id") else None
    if len(batch.mm_placeholders) != len(expected):
        raise InvalidRequest(f"{where}: {len(batch.mm_placeholders)} placeholders for "
                             f"{len(expected)} items")  # fmt: skip
    for i, placeholder in enumerate(batch.mm_placeholders):
        offset, end = mm.placeholder_span(placeholder, i, where, len(ids))
        length = end - offset
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
        want = expected[i]
        if want is not None and embeds != want:
            # vLLM takes the run as given: a longer one fails inside the engine and kills it, a
            # shorter one gets the first embeddings only (the rest silently dropped).
            relation = "more" if embeds > want else "fewer"
            raise InvalidRequest(
                f"{where}.mm_placeholders[{i}]: {embeds} embedding positions, {relation} than "
                f"the {want} the encoder produces for this item (count the im_token_id "
                "positions in the range, or its whole length without im_token_id)"
            )
        if max_embeds is not None and embeds > max_embeds:
            # More positions than the encoder fills would fail inside the engine and kill it.
            raise InvalidRequest(
                f"{where}.mm_placeholders[{i}]: {embeds} embedding positions, more than the "
                f"{max_embeds} this model produces for one item"
            )
        ranges.append(PlaceholderRange(offset=offset, length=length, is_embed=is_embed))
    return ranges


def _tensors(batch: Any, where: str, modality: str, facts: TensorFacts) -> dict[str, Any]:
    if not batch.HasField("pixel_values"):
        raise InvalidRequest(f"{where}: pixel_values is missing")
    key = batch.encoder_input_key or "pixel_values"
    if modality == "video" and key == "pixel_values":
        key = "pixel_values_videos"
    tensors = {key: to_torch(read_tensor(batch.pixel_values, f"{where}.pixel_values"))}
    pixels = tensors[key]
    if facts.device_normalize and pixels.dtype != torch.uint8:
        # The engine rescales and normalizes on its device (the mm_device_do_normalize label):
        # pixels a processor already normalized would be normalized twice.
        raise InvalidRequest(
            f"{where}.pixel_values: this worker normalizes pixels on its device and takes them "
            f"as uint8, not {str(pixels.dtype).removeprefix('torch.')}"
        )
    if pixels.is_floating_point() and pixels.dim() > 1 and pixels.shape[0]:
        # Idefics2/3-style towers drop an all-zero tile as padding: the item then makes no
        # embeddings and the engine fails on it and dies. A real image never normalizes to
        # exact zeros everywhere (the means are not on the 8-bit grid).
        empty = (pixels.reshape(pixels.shape[0], -1) == 0).all(dim=1)
        if bool(empty.any()):
            raise InvalidRequest(
                f"{where}.pixel_values[{int(empty.nonzero()[0])}]: the tile is all zeros"
            )
    total = tensors[key].numel() * tensors[key].element_size()
    for name in sorted(batch.model_specific_tensors):
        if name in tensors:
            raise InvalidRequest(f"{where}: tensor {name!r} is given twice")
        tensors[name] = to_torch(read_tensor(batch.model_specific_tensors[name], f"{where}.{name}"))
        total += tensors[name].numel() * tensors[name].element_size()
        if total > MAX_TENSOR_BYTES:
            raise InvalidRequest(f"{where}: the tensors are over {MAX_TENSOR_BYTES} bytes")
    return {
        name: t.to(facts.dtype) if t.is_floating_point() and t.dtype != facts.dtype else t
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
            if sizes.dim() > 1 or bool((sizes < 0).any()):
                raise InvalidRequest(
                    f"{where}: sizes tensor {batch.flat_keys[name]!r} must be one non-negative "
                    "size per item"
                )
            rows = int(tensors[name].shape[0]) if tensors[name].dim() else -1
            if int(sizes.sum()) != rows:
                raise InvalidRequest(
                    f"{where}: sizes tensor {batch.flat_keys[name]!r} adds up to "
                    f"{int(sizes.sum())}, {name} has {rows} rows"
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
    facts: TensorFacts,
    request_id: str,
) -> tuple[str, list[Any], list[str], list[PlaceholderRange]]:
    modality, count = mm.batch_modality(batch, where)
    if facts.limits and not facts.limits.get(modality):
        raise InvalidRequest(f"{where}: this model does not accept {modality} input")
    tensors = _tensors(batch, where, modality, facts)
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
    layout = facts.layouts.get(modality)
    expected: list[int | None] = [None] * count
    if layout is not None:
        for i, item in enumerate(items):
            expected[i] = layout.check(item, f"{where} item {i}")
    hashes = [str(h) for h in batch.mm_hashes] or [
        f"{request_id}:{modality}:{where}:{i}" for i in range(count)
    ]
    if len(hashes) != count:
        raise InvalidRequest(f"{where}: {len(hashes)} mm_hashes for {count} items")
    mm.check_hash_lengths(hashes, where)
    ranges = _placeholders(batch, where, ids, expected, facts.max_embeds.get(modality))
    return modality, items, hashes, ranges


def _same_item(a: Any, b: Any) -> bool:
    if set(a) != set(b):
        return False
    for key in a:
        x, y = a[key].data, b[key].data
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def _check_hashes(kwargs: Mapping[str, list[Any]], hashes: Mapping[str, list[str]]) -> None:
    """One hash, one content: vLLM caches the encoder's output by hash, so a second item under
    a hash would silently get the first one's embeddings."""
    for modality, items in kwargs.items():
        seen: dict[str, Any] = {}
        for item, item_hash in zip(items, hashes[modality], strict=True):
            first = seen.setdefault(item_hash, item)
            if first is not item and not _same_item(first, item):
                raise InvalidRequest(
                    f"mm_hashes: {item_hash[:80]!r} names two {modality} items with different "
                    "tensors"
                )


@dataclass(frozen=True)
class TensorFacts:
    """What building a tensor request needs of the model, read once at start."""

    dtype: torch.dtype
    #: The most embedding positions one item of a modality fills (vLLM's encoder budget).
    max_embeds: Mapping[str, int]
    #: The items per prompt the worker takes, per modality (empty: not known, not checked).
    limits: Mapping[str, int] = dataclasses.field(default_factory=dict[str, int])
    #: What an item of a modality looks like, learnt from vLLM's processor (none: not known).
    layouts: Mapping[str, ItemLayout] = dataclasses.field(default_factory=dict[str, ItemLayout])
    #: The engine rescales and normalizes pixels on its device (vLLM's
    #: ``mm_device_do_normalize``): it takes them as uint8.
    device_normalize: bool = False


def tensor_input(request: Any, ids: list[int], facts: TensorFacts) -> Any:
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
    for modality, items in kwargs.items():
        limit = facts.limits.get(modality)
        if limit is not None and len(items) > limit:
            raise InvalidRequest(f"more than {limit} {modality} item(s) in one request")
    _check_hashes(kwargs, hashes)
    mm.check_apart([(r.offset, r.offset + r.length) for rs in placeholders.values() for r in rs])
    text = request.tokenized.original_text if request.WhichOneof("input") == "tokenized" else ""
    return mm_input(
        ids,
        MultiModalKwargsItems(kwargs),
        hashes,
        placeholders,  # pyright: ignore[reportArgumentType]
        prompt=text or None,
    )


class GuardedConnection(HTTPConnection):
    """vLLM's HTTP connection with every async GET through a :class:`GuardedFetcher` (the media
    connector's ``connection``): vLLM's retries, size limits and status handling stay vLLM's;
    where it connects and which redirects it follows are the fetcher's. The synchronous client
    is refused (the worker fetches asynchronously only)."""

    def __init__(self, fetcher: GuardedFetcher) -> None:
        super().__init__(reuse_client=True)
        self.fetcher = fetcher

    def get_sync_client(self) -> Any:
        raise RuntimeError("synchronous media fetches are not guarded; use the async path")

    async def get_async_client(self) -> Any:
        return self.fetcher.session()

    async def get_async_response(
        self,
        url: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - vLLM's signature
        extra_headers: Mapping[str, str] | None = None,
        allow_redirects: bool = True,
    ) -> Any:
        self._validate_http_url(url)
        return self.fetcher.get(
            url,
            headers=self._headers(**(extra_headers or {})),
            timeout=timeout,
            allow_redirects=allow_redirects,
        )


def mm_data(data: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The fetched media (a list per modality) as vLLM's ``multi_modal_data``: a lone image bare,
    everything else a list. A lone video is a ``(frames, metadata)`` pair in vLLM's
    ``MediaWithBytes`` wrapper, which vLLM's parser would take apart as a list of items."""
    return {m: v[0] if len(v) == 1 and m == "image" else list(v) for m, v in data.items()}


class InprocessProcessor:
    """Media refs fetched and processed inside the worker (``--mm-processor inprocess``)."""

    def __init__(
        self,
        engine: Any,
        settings: MmSettings,
        *,
        opt_in: str = OPT_IN_FLAG,
        fetcher: GuardedFetcher | None = None,
    ) -> None:
        """``engine``: anything with vLLM's ``model_config`` and ``renderer`` (an ``AsyncLLM``,
        or the sidecar's config and renderer). ``opt_in`` names the private-hosts opt-in in
        refusals (the sidecar's flag differs); ``fetcher`` replaces the guarded fetcher built
        from ``settings`` (tests: an inner resolver)."""
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
                "from any host the router forwards that is not private (see %s)",
                settings.processor,
                opt_in,
            )
        if settings.allow_private_media_hosts:
            logger.warning(
                "private media hosts allowed (%s): media URLs may reach loopback and link-local "
                "addresses of this machine's network; cloud metadata, unspecified and multicast "
                "addresses stay refused",
                opt_in,
            )
        else:
            logger.info(
                "media URLs resolving to loopback, link-local, cloud metadata, unspecified or "
                "multicast addresses are refused (%s allows loopback and link-local)",
                opt_in,
            )
        self.fetcher = fetcher or GuardedFetcher(
            AddressPolicy(settings.allow_private_media_hosts, opt_in),
            allowed_domains=domains or (),
        )
        self.connector = MEDIA_CONNECTOR_REGISTRY.load(  # pyright: ignore[reportUnknownMemberType]
            vllm_envs.VLLM_MEDIA_CONNECTOR,
            media_io_kwargs=media_io_kwargs,
            connection=GuardedConnection(self.fetcher),
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
        """The fetcher's HTTP session."""
        await self.fetcher.aclose()

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
        prompt: dict[str, Any] = {"prompt_token_ids": ids, "multi_modal_data": mm_data(data)}
        if text:
            prompt["prompt"] = text
        try:
            process = self.renderer.process_for_engine_async
            return await process(
                prompt, time.time(), **releases.keywords(process, skip_mm_cache=True)
            )
        except (RuntimeError, ValueError) as exc:
            logger.info("media processing refused the request (%s)", type(exc).__name__)
            raise InvalidRequest(
                "the media do not match the prompt's anchors or the model's limits"
            ) from exc
        except ImportError as exc:
            # vLLM reaches for an optional package only some media need (audio at another
            # sample rate than the model's is resampled with torchaudio): the request is one
            # this worker cannot process, not a fault of the server.
            logger.warning("media processing needs an optional package that is not installed")
            raise InvalidRequest(
                "these media need an optional package this worker does not have (audio at "
                "another sample rate than the model's is resampled with torchaudio)"
            ) from exc

    async def engine_input(
        self, ids: list[int], items: Sequence[MediaItem], text: str, request_id: str = ""
    ) -> Any:
        return await self.process(ids, await self.fetch(items), text)


def model_dtype(engine: Any) -> torch.dtype:
    dtype = getattr(engine.model_config, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def tensor_facts(
    engine: Any, max_embeds: Mapping[str, int], limits: Mapping[str, int] | None = None
) -> TensorFacts:
    """What building a tensor request needs; with ``limits`` (the items per prompt the worker
    takes), the item layouts too (:func:`item_layouts`)."""
    limits = dict(limits or {})
    return TensorFacts(
        model_dtype(engine),
        max_embeds,
        limits,
        item_layouts(engine, limits),
        device_normalize=device_normalizes(engine),
    )


def device_normalizes(engine: Any) -> bool:
    """vLLM's own ``mm_device_do_normalize`` (0.32+; resolved from the model's support and the
    flag): the engine rescales and normalizes pixels on its device. False for a text model and
    for a vLLM without it."""
    config = getattr(engine.model_config, "multimodal_config", None)
    return bool(getattr(config, "mm_device_do_normalize", False))


def mm_facts(engine: Any) -> MmFacts:
    """The model's multimodal facts; a text model (or ``--language-model-only``) has none."""
    mc = engine.model_config
    if not releases.supports_multimodal_inputs(mc, MULTIMODAL_REGISTRY):
        return MmFacts()
    processor = MULTIMODAL_REGISTRY.create_processor(mc)
    limits = {m: int(n) for m, n in processor.info.allowed_mm_limits.items() if n}
    try:  # the module moved between vLLM releases; the label is informative only
        from vllm.multimodal.encoder_budget import MultiModalBudget  # noqa: PLC0415 - vLLM, moves

        counted = MultiModalBudget(
            engine.vllm_config,
            MULTIMODAL_REGISTRY,
            **releases.keywords(MultiModalBudget, enable_cache=False),  # 0.27+
        )
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
        device_normalize=device_normalizes(engine),
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


# The sidecar's vLLM pieces ---------------------------------------------------------------------


def fingerprint_of(model_config: Any) -> Fingerprint:
    """The protocol fingerprint of a vLLM model configuration (the worker's engine, the sidecar's
    config). The limits are vLLM's resolved per-modality counts (``{"image": 2}`` and
    ``{"image": {"count": 2}}`` agree)."""
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


def sidecar_input(
    ids: list[int],
    kwargs: Mapping[str, list[Any]],
    hashes: Mapping[str, list[str]],
    spans: Mapping[str, Sequence[tuple[int, int, Sequence[bool] | None]]],
    *,
    text: str,
    arrival_time: float,
) -> Any:
    """A checked sidecar result as vLLM's engine input: the decoded items, their hashes and
    their placeholders (``(offset, length, embed mask or None)``, checked by the caller)."""
    placeholders = {
        modality: [
            PlaceholderRange(
                offset=offset,
                length=length,
                is_embed=None if mask is None else torch.tensor(mask, dtype=torch.bool),
            )
            for offset, length, mask in ranges
        ]
        for modality, ranges in spans.items()
    }
    engine_input = mm_input(
        ids,
        MultiModalKwargsItems(dict(kwargs)),
        dict(hashes),
        placeholders,  # pyright: ignore[reportArgumentType]
        prompt=text or None,
    )
    engine_input["arrival_time"] = arrival_time  # pyright: ignore[reportGeneralTypeIssues]
    return engine_input


def sidecar_parser(prog: str, description: str, add_own: Callable[[Any], None]) -> Any:
    """vLLM's argument parser with the caller's flags (``add_own(parser)``), then vLLM's engine
    arguments."""
    # The sidecar's alone (a worker never parses them): imported when the sidecar starts.
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415 - vLLM, the sidecar's
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415 - vLLM, the sidecar's

    parser = FlexibleArgumentParser(prog=prog, description=description)
    add_own(parser)
    return AsyncEngineArgs.add_cli_args(parser)


def sidecar_renderer(namespace: Any) -> tuple[Any, Any]:
    """vLLM's configuration for the parsed engine arguments and its renderer (no engine, no KV
    cache, no weights); the renderer is None for a model that accepts no media."""
    # The sidecar's alone (a worker never builds a renderer from a command line).
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415 - vLLM, the sidecar's
    from vllm.renderers.registry import (  # noqa: PLC0415 - vLLM, the sidecar's
        renderer_from_config,  # pyright: ignore[reportUnknownVariableType]
    )

    engine_args = AsyncEngineArgs.from_cli_args(namespace)
    engine_args.quantization = None  # the processor needs none; no weights are loaded
    vllm_config = engine_args.create_engine_config()
    if not releases.supports_multimodal_inputs(vllm_config.model_config, MULTIMODAL_REGISTRY):
        return vllm_config, None
    renderer: Any = renderer_from_config(vllm_config)  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
    return vllm_config, renderer

"""``--mm-processor redis``: the worker's side of the GPU-free sidecar over Redis. Engine-free.

:class:`RedisProcessor` submits a job through
:class:`smg_servicer_mm_sidecar.client.SidecarClient`, checks the result (fingerprint, counts,
placeholder spans, ids) and has :mod:`._mm_engine` rebuild vLLM's engine input from it (the
``MultiModalKwargsItem`` blobs decoded, floating tensors cast to the model's dtype). The sidecar's
side is :mod:`smg_servicer_vllm.mm_sidecar`; the protocol is smg-servicer-mm-sidecar's.

At start (:func:`check_redis_at_start`, in the servicer's constructor) one PING tells a Redis
that refuses us (the user name or password, the ACL, the TLS handshake: a configuration error,
exit 2) from one that cannot be reached yet (a warning; media refs are UNAVAILABLE until it
answers, as they are whenever Redis goes away while serving). The URL is only ever logged with
its password redacted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from smg_servicer_core import validate
from smg_servicer_core.errors import ConfigError, InvalidRequest, ServicerError, Unavailable
from smg_servicer_mm_sidecar.client import RedisRejected, SidecarClient, check_redis, connect
from smg_servicer_mm_sidecar.protocol import (
    MODALITIES,
    SIDECAR_PROTOCOL,
    JobItem,
    JobResult,
    SidecarError,
    client_message,
)
from smg_servicer_vllm.mm import MediaItem, accepted_schemes
from smg_servicer_vllm.mm_settings import MmSettings, redact_url, redis_tls

logger = logging.getLogger(__name__)
#: A placeholder as the engine side takes it: offset, length, embed mask (None: every position).
Span = tuple[int, int, list[bool] | None]


def as_servicer_error(exc: SidecarError) -> ServicerError:
    message = client_message(exc.code, exc.message)
    if exc.status == "INVALID_ARGUMENT":
        return InvalidRequest(message)
    if exc.status == "INTERNAL":  # a timeout: the router must not spend the budget again
        return ServicerError(message)
    return Unavailable(message)


def check_redis_at_start(settings: MmSettings) -> None:
    """Raise ``ConfigError`` when Redis refuses us; log a warning when it cannot be reached."""
    url = settings.redis_url
    tls = redis_tls(url, settings.tls)
    try:
        problem = check_redis(url, tls)
    except RedisRejected as exc:
        raise ConfigError(f"--mm-redis-url {redact_url(url)}: {exc}") from None
    if problem:
        logger.warning(
            "the multimodal sidecar's Redis %s cannot be reached now (%s); media refs are "
            "UNAVAILABLE until it answers",
            redact_url(url),
            problem,
        )


class RedisProcessor:
    """Media refs sent to the sidecar; its tensors rebuilt into vLLM's engine input."""

    def __init__(
        self,
        engine: Any,
        settings: MmSettings,
        dtype: Any,
        max_embeds: Mapping[str, int] | None = None,
    ) -> None:
        """``dtype``: the model's ``torch.dtype``. ``max_embeds``: the most embedding positions
        one item of a modality fills (vLLM's per-item maximum): a result that places more would
        fail inside the engine."""
        try:
            redis = connect(settings.redis_url, redis_tls(settings.redis_url, settings.tls))
        except ImportError as exc:
            raise ConfigError(
                "--mm-processor redis needs the Redis client: "
                "pip install 'smg-servicer-vllm[redis]'"
            ) from exc
        check_redis_at_start(settings)
        # The engine side (vLLM, torch): a worker's engine is up by now; this module is not.
        from smg_servicer_vllm import _mm_engine  # noqa: PLC0415 - vLLM, torch

        self._engine_side = _mm_engine
        mc = engine.model_config
        self.vocab_size = int(mc.get_vocab_size())
        self.context_length = int(mc.max_model_len)
        self.dtype = dtype
        self.max_embeds = dict(max_embeds or {})
        self.client = SidecarClient(
            redis,
            _mm_engine.fingerprint_of(mc),
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
        spans: dict[str, list[Span]] = {}
        hashes: dict[str, list[str]] = {}
        for modality, blobs in result.mm_kwargs.items():
            ranges = result.mm_placeholders.get(modality, [])
            names = result.mm_hashes.get(modality, [])
            if modality not in MODALITIES or not (len(blobs) == len(ranges) == len(names)):
                raise SidecarError(SIDECAR_PROTOCOL, f"the {modality} result is inconsistent")
            limit = self.max_embeds.get(modality)
            spans[modality] = [self._span(p, len(ids), limit) for p in ranges]
            try:
                kwargs[modality] = [self._engine_side.decode_item(b, self.dtype) for b in blobs]
            except Exception as exc:  # msgspec, torch or vLLM's decoder: a broken result
                raise SidecarError(SIDECAR_PROTOCOL, "the result's tensors are unreadable") from exc
            hashes[modality] = list(names)
        if sum(len(v) for v in kwargs.values()) != count:
            raise SidecarError(SIDECAR_PROTOCOL, "the result holds the wrong number of items")
        return self._engine_side.sidecar_input(
            ids, kwargs, hashes, spans, text=text, arrival_time=started
        )

    @staticmethod
    def _span(placeholder: Any, prompt_len: int, max_embeds: int | None) -> Span:
        offset, length = int(placeholder.offset), int(placeholder.length)
        mask = placeholder.is_embed
        if length <= 0 or offset < 0 or offset + length > prompt_len:
            raise SidecarError(SIDECAR_PROTOCOL, "a placeholder lies outside the prompt")
        if mask is not None and len(mask) != length:
            raise SidecarError(SIDECAR_PROTOCOL, "a placeholder's embed mask has the wrong size")
        embeds = sum(mask) if mask is not None else length
        if max_embeds is not None and embeds > max_embeds:
            raise SidecarError(SIDECAR_PROTOCOL, "a placeholder is longer than the model's items")
        return offset, length, None if mask is None else list(mask)

    async def aclose(self) -> None:
        await self.client.aclose()

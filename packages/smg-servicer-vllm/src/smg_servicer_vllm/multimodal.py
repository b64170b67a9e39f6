"""vLLM multimodal, one owner: a media request is checked and parsed once into a
:class:`MediaPlan`, which the engine-side step builds under the ``--mm-max-inflight`` gate.
Engine-free: vLLM and torch are imported by :mod:`._mm_engine` when a :class:`MultimodalPath` is
built (the worker's engine is up by then).

- :meth:`MultimodalPath.plan`: before the request is tracked, the cheap checks (the model takes
  media, the media refs' rules of :func:`~smg_servicer_vllm.mm.media_items`); no fetch, no
  tensor read;
- :meth:`MultimodalPath.engine_input`: while the request is tracked (an Abort stops the work),
  the plan's media refs fetched and processed (``--mm-processor inprocess``: vLLM's connector and
  renderer; ``redis``: the sidecar) or its tensors read (router-preprocessed ``mm_inputs``), into
  vLLM's engine input. Nothing is checked again.

A request refused as the client's fault frees its unread shared-memory tensors (:meth:`release`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.tensors import release_shm, shm_namespace_id
from smg_servicer_vllm.mm import (
    MediaItem,
    MmFacts,
    MmGate,
    accepted_schemes,
    format_limits,
    item_limits,
    media_items,
)
from smg_servicer_vllm.mm_redis import RedisProcessor
from smg_servicer_vllm.mm_settings import MmSettings

__all__ = ["MediaPlan", "MediaProcessor", "MmFacts", "MultimodalPath"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MediaPlan:
    """A multimodal request, checked once: what the engine-side step builds.

    ``items`` are its media refs, parsed and checked (empty: router-preprocessed tensors, read
    from ``request`` when the input is built). ``ids`` are the prompt's token ids, already
    validated against the model's vocabulary and context length."""

    request: Any
    ids: list[int]
    items: tuple[MediaItem, ...] = ()

    @property
    def request_id(self) -> str:
        return str(self.request.request_id)

    @property
    def text(self) -> str:
        return str(self.request.tokenized.original_text)


class MediaProcessor(Protocol):
    """Turns media refs into vLLM's engine input (in the worker, or through the sidecar)."""

    @property
    def schemes(self) -> tuple[str, ...]: ...

    @property
    def advertised(self) -> bool: ...

    async def refresh(self) -> None: ...

    async def aclose(self) -> None: ...

    async def engine_input(
        self, ids: list[int], items: Sequence[MediaItem], text: str, request_id: str = ""
    ) -> Any: ...


class MultimodalPath:
    """A request's multimodal input -> vLLM's engine input, under the ``--mm-max-inflight`` gate."""

    def __init__(self, engine: Any, settings: MmSettings) -> None:
        # The engine side (vLLM, torch): a worker's engine is up by now; this module is not.
        from smg_servicer_vllm import _mm_engine  # noqa: PLC0415 - vLLM, torch

        self._engine_side = _mm_engine
        self.settings = settings
        try:
            self.facts = _mm_engine.mm_facts(engine)
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
        self.tensor_facts = _mm_engine.tensor_facts(
            engine, self.facts.max_embeds_per_item, self.limits if self.facts.supported else None
        )
        self.gate = MmGate(settings.max_inflight)
        self.processor: MediaProcessor | None = None
        if self.mode == "inprocess":
            self.processor = _mm_engine.InprocessProcessor(engine, settings)
        elif self.mode == "redis":
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

    def plan(self, request: Any, ids: list[int]) -> MediaPlan:
        """The cheap checks of a multimodal request (no fetch, no tensor read) and its media refs
        parsed, once. ``ids``: its tokenized prompt, already validated."""
        if not self.facts.supported:
            raise InvalidRequest("this model accepts no multimodal input")
        if not request.HasField("media_refs"):
            return MediaPlan(request, ids)
        items = media_items(
            request,
            self.settings,
            limits=self.limits,
            schemes=self.schemes,
            anchors=self.facts.anchors,
        )
        return MediaPlan(request, ids, tuple(items))

    async def engine_input(self, plan: MediaPlan) -> Any:
        """vLLM's engine input for a planned request: its media fetched and processed, or its
        tensors read (off the event loop). A client fault frees the request's unread
        shared-memory tensors."""
        try:
            with self.gate.slot():
                if plan.items:
                    assert self.processor is not None  # processing is on (media_items checked)
                    return await self.processor.engine_input(
                        plan.ids, plan.items, plan.text, plan.request_id
                    )
                return await asyncio.to_thread(
                    self._engine_side.tensor_input, plan.request, plan.ids, self.tensor_facts
                )
        except InvalidRequest:
            self.release(plan.request)  # a client fault: nobody reads its tensors now
            raise

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
            "mm_device_do_normalize": self.facts.device_normalize,
        }
        if self.advertised:
            fields |= {
                "mm_processor": self.mode,
                "mm_media_ref_schemes": ",".join(self.schemes),
                "mm_processor_source": self.settings.source,
            }
        return fields

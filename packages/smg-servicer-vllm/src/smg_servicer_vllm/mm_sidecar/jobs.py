"""The sidecar's vLLM side: a job's media fetched and processed with vLLM's own media connector
and renderer (:class:`VllmJobProcessor`), the result's wire fields, the command line's parser
(the sidecar's flags and vLLM's engine arguments) and the serving loop. Imports vLLM and torch:
:mod:`.process` imports it only once Redis has accepted the sidecar."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_mm_sidecar.protocol import (
    SCHEMA,
    Job,
    JobResult,
    Placeholder,
    Timing,
    failure,
)
from smg_servicer_mm_sidecar.service import Sidecar
from smg_servicer_vllm import _mm_engine
from smg_servicer_vllm.mm import MediaItem, MediaRefused, MediaUnavailable
from smg_servicer_vllm.mm_settings import MmSettings
from smg_servicer_vllm.mm_sidecar.settings import OPT_IN_FLAG, PROG, SETTINGS

logger = logging.getLogger("smg_servicer_mm_sidecar")


def result_fields(engine_input: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's processed input -> the ``JobResult`` fields (each item one vLLM msgpack blob)."""
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
            m: [_mm_engine.encode_item(item) for item in items]
            for m, items in engine_input["mm_kwargs"].items()
        },
    }


def process_code(cause: BaseException | None) -> str:
    """The protocol code of a processing failure, by vLLM's exception."""
    if isinstance(cause, RuntimeError):
        return "placeholder_mismatch"
    if isinstance(cause, ValueError):
        return "limit_exceeded" if "at most" in str(cause) else "decode_failed"
    return "processor_error"


class VllmJobProcessor:
    """A job's media fetched and processed with vLLM's own connector and renderer."""

    def __init__(
        self,
        vllm_config: Any,
        renderer: Any,
        max_video_frames: int = 0,
        *,
        allow_private_media_hosts: bool = False,
        fetcher: Any = None,
    ) -> None:
        settings = MmSettings(
            processor="inprocess",
            max_video_frames=max_video_frames,
            allow_private_media_hosts=allow_private_media_hosts,
        )
        engine = SimpleNamespace(model_config=vllm_config.model_config, renderer=renderer)
        self.inner = _mm_engine.InprocessProcessor(
            engine, settings, opt_in=OPT_IN_FLAG, fetcher=fetcher
        )
        self.fingerprint = _mm_engine.fingerprint_of(vllm_config.model_config)
        self.schemes = self.inner.schemes

    async def process(self, job: Job) -> JobResult:
        started = time.time()
        queue_ms = max(0.0, started * 1000 - job.enqueued_ms)
        for index, item in enumerate(job.items):
            scheme = item.url.partition(":")[0].lower()
            if scheme not in self.schemes:
                return failure(
                    job.job_id,
                    "scheme_not_accepted",
                    f"media_refs.items[{index}]: the sidecar accepts {', '.join(self.schemes)}",
                )
        items = [MediaItem(modality=i.modality, url=i.url) for i in job.items]
        try:
            data = await self.inner.fetch(items)
        except (MediaRefused, MediaUnavailable) as exc:
            return failure(job.job_id, exc.reason, exc.message)
        fetched = time.time()
        try:
            processed = await self.inner.process(list(job.prompt_token_ids), data, job.prompt or "")
        except InvalidRequest as exc:
            return failure(job.job_id, process_code(exc.__cause__), exc.message)
        done = time.time()
        timing = Timing(
            queue_ms=queue_ms,
            fetch_ms=(fetched - started) * 1000,
            process_ms=(done - fetched) * 1000,
        )
        return JobResult(
            v=SCHEMA,
            job_id=job.job_id,
            ok=True,
            fingerprint=self.fingerprint,
            timing=timing,
            **result_fields(processed),
        )


def build_parser() -> Any:
    def add_own(parser: Any) -> None:
        group: Any = parser.add_argument_group("sidecar")
        for setting in SETTINGS:
            setting.add_to_parser(group)

    return _mm_engine.sidecar_parser(
        PROG,
        "The GPU-free multimodal sidecar of SMG vLLM workers (--mm-processor redis).",
        add_own,
    )


async def serve(sidecar: Sidecar) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await sidecar.run(stop)
    finally:
        await sidecar.redis.aclose()
        if isinstance(sidecar.processor, VllmJobProcessor):
            await sidecar.processor.inner.aclose()  # the media fetcher's HTTP session
    logger.info("mm sidecar stopped (%s)", sidecar.counters)


def processor_for(namespace: Any, resolved: Any) -> VllmJobProcessor | None:
    """vLLM's configuration and renderer for the command line's model (no engine), behind a job
    processor with the sidecar's settings; None for a model that accepts no media."""
    vllm_config, renderer = _mm_engine.sidecar_renderer(namespace)
    if renderer is None:
        return None
    return VllmJobProcessor(
        vllm_config,
        renderer,
        resolved["mm_max_video_frames"],
        allow_private_media_hosts=resolved["allow_private_media_hosts"],
    )

"""The sidecar process: ``python -m smg_servicer_vllm.mm_sidecar`` (and the facade's
``python -m smg_grpc_servicer.vllm.mm_sidecar``).

::

    python -m smg_grpc_servicer.vllm.mm_sidecar --model M --redis-url URL [--namespace NS]
        [--redis-ca-file CA.pem] [--redis-cert-file C.pem --redis-key-file K.pem]
        [--concurrency 2] [--allowed-media-domains ...] [--allow-private-media-hosts]
        <vLLM engine args>

Builds vLLM's configuration and renderer for the model (no engine, no KV cache, no GPU), then
serves the job list of its namespace (:mod:`smg_servicer_mm_sidecar.service`): each job's media
are fetched with vLLM's media connector (``--allowed-media-domains``,
``--allowed-local-media-path``, ``--media-io-kwargs``, ``VLLM_*_FETCH_TIMEOUT``) and processed by
vLLM's renderer under the sidecar's ``--limit-mm-per-prompt``; the items travel back as vLLM
msgpack blobs. Media hosts that are or resolve to loopback, link-local, cloud metadata,
unspecified or multicast addresses are refused as on the worker (:mod:`..media_guard`; code
``domain_not_allowed``); ``--allow-private-media-hosts`` (``SMG_VLLM_MM_ALLOW_PRIVATE_MEDIA_HOSTS``)
allows loopback and link-local.

``--redis-url``, ``--redis-{ca,cert,key}-file`` and ``--namespace`` resolve like the worker's
``--mm-redis-url``, ``--mm-redis-{ca,cert,key}-file`` and ``--mm-sidecar-namespace``: flag, then
``SMG_VLLM_MM_REDIS_URL`` / ``SMG_VLLM_MM_REDIS_{CA,CERT,KEY}_FILE`` /
``SMG_VLLM_MM_SIDECAR_NAMESPACE``, then the default (the namespace derived from the fingerprint).
Before vLLM's processor is built, one PING checks the link: a Redis that refuses the user name,
password, ACL or TLS handshake is a configuration error (one line, exit 2); one that cannot be
reached yet is a warning (the loops retry). The URL is only logged with its password redacted.
``SMG_VLLM_MM_MAX_RESULT_BYTES`` (512 MiB) caps an encoded result and
``SMG_VLLM_MM_MAX_VIDEO_FRAMES`` caps video sampling. SIGTERM or SIGINT: ``hello`` is removed,
every loop finishes the job it holds, exit 0. A bad setting: one line, exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from smg_servicer_core.config import environment, resolve
from smg_servicer_core.errors import ConfigError, InvalidRequest
from smg_servicer_mm_sidecar.client import RedisRejected, RedisTls, check_redis, connect
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
from smg_servicer_vllm.mm_settings import MmSettings, RedisUrl, redact_url, redis_tls
from smg_servicer_vllm.mm_sidecar.settings import SETTINGS, TLS_FLAGS

#: How the sidecar's refusals name its private-hosts opt-in.
OPT_IN_FLAG = "--allow-private-media-hosts"
#: One logger tree with the sidecar's loops (``smg_servicer_mm_sidecar.service``).
logger = logging.getLogger("smg_servicer_mm_sidecar")
PROG = "python -m smg_grpc_servicer.vllm.mm_sidecar"
REDIS_EXTRA = "'smg-servicer-vllm[redis]'"


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


def check_at_start(url: str, tls: RedisTls) -> None:
    """Exit 2 (one line) when Redis refuses us; a warning when it cannot be reached yet."""
    try:
        problem = check_redis(url, tls)
    except RedisRejected as exc:
        print(f"{PROG}: --redis-url {redact_url(url)}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if problem:
        logger.warning("Redis %s cannot be reached now (%s); retrying", redact_url(url), problem)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = build_parser()
    namespace = parser.parse_args(argv)
    try:
        resolved = resolve(SETTINGS, namespace, environment())
        url: RedisUrl = resolved["redis_url"]
        files = (resolved[f"redis_{kind}_file"] for kind in ("ca", "cert", "key"))
        tls = redis_tls(url, RedisTls(*files), TLS_FLAGS)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        redis = connect(url, tls)  # no connection yet: the loops make it
    except ImportError:
        print(f"{PROG}: needs the Redis client: pip install {REDIS_EXTRA}", file=sys.stderr)
        raise SystemExit(2) from None
    check_at_start(url, tls)
    namespace.redis_url = url  # vLLM may log the namespace: the URL's repr hides its password

    logger.info("building vLLM's configuration and processor for %s", namespace.model)
    vllm_config, renderer = _mm_engine.sidecar_renderer(namespace)
    if renderer is None:
        print(f"{PROG}: {namespace.model} accepts no media; nothing to serve", file=sys.stderr)
        raise SystemExit(2)
    processor = VllmJobProcessor(
        vllm_config,
        renderer,
        resolved["mm_max_video_frames"],
        allow_private_media_hosts=resolved["allow_private_media_hosts"],
    )
    sidecar = Sidecar(
        redis,
        processor.fingerprint,
        processor,
        namespace=resolved["namespace"],
        concurrency=resolved["concurrency"],
        max_result_bytes=resolved["max_result_bytes"],
        settings_source=resolved.source("namespace"),
    )
    logger.info(
        "mm sidecar serving %s: Redis %s, namespace %s (%s), concurrency %d, schemes %s, "
        "max result %d bytes",
        namespace.model,
        redact_url(url),
        sidecar.keys.namespace,
        resolved.source("namespace"),
        resolved["concurrency"],
        ",".join(processor.schemes),
        sidecar.max_result_bytes,
    )
    logger.info(
        "private media hosts %s (%s)",
        "allowed" if resolved["allow_private_media_hosts"] else "refused",
        resolved.source("allow_private_media_hosts"),
    )
    asyncio.run(serve(sidecar))

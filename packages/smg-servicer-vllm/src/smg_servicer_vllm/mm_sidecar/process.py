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
Before vLLM and torch are imported (:mod:`.jobs`: ~20 s), the sidecar's own settings are read
and one PING checks the link: a bad setting, a missing Redis client, or a Redis that refuses the
user name, password, ACL or TLS handshake is a configuration error (one line, exit 2, in about
a second); one that cannot be reached yet is a warning (the loops retry). The URL is only
logged with its password redacted. ``SMG_VLLM_MM_MAX_RESULT_BYTES`` (512 MiB) caps an encoded
result and ``SMG_VLLM_MM_MAX_VIDEO_FRAMES`` caps video sampling. SIGTERM or SIGINT: ``hello`` is
removed, every loop finishes the job it holds, exit 0. A bad setting: one line, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from smg_servicer_core.cli import own_flags_parser
from smg_servicer_core.config import ResolvedSettings, environment, resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_mm_sidecar.client import RedisRejected, RedisTls, check_redis, connect
from smg_servicer_mm_sidecar.service import Sidecar
from smg_servicer_vllm.mm_settings import RedisUrl, redact_url, redis_tls
from smg_servicer_vllm.mm_sidecar.settings import PROG, SETTINGS, TLS_FLAGS

#: One logger tree with the sidecar's loops (``smg_servicer_mm_sidecar.service``).
logger = logging.getLogger("smg_servicer_mm_sidecar")
REDIS_EXTRA = "'smg-servicer-vllm[redis]'"


def check_at_start(url: str, tls: RedisTls) -> None:
    """Exit 2 (one line) when Redis refuses us; a warning when it cannot be reached yet."""
    try:
        problem = check_redis(url, tls)
    except RedisRejected as exc:
        print(f"{PROG}: --redis-url {redact_url(url)}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if problem:
        logger.warning("Redis %s cannot be reached now (%s); retrying", redact_url(url), problem)


def _settings(namespace: argparse.Namespace) -> tuple[ResolvedSettings, RedisUrl, RedisTls]:
    """The sidecar's settings from ``namespace`` (flag > variable > default), its Redis URL and
    TLS files; a bad one: one line, exit 2."""
    try:
        resolved = resolve(SETTINGS, namespace, environment())
        url: RedisUrl = resolved["redis_url"]
        files = (resolved[f"redis_{kind}_file"] for kind in ("ca", "cert", "key"))
        return resolved, url, redis_tls(url, RedisTls(*files), TLS_FLAGS)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def own_flags(argv: Sequence[str]) -> argparse.Namespace:
    """The sidecar's own flags of ``argv`` (vLLM's engine arguments left aside), read without
    vLLM: enough to check the settings and Redis before vLLM and torch are imported."""
    parser = own_flags_parser(PROG.removeprefix("python -m "), SETTINGS, "vLLM")
    return parser.parse_known_args(argv)[0]


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = list(sys.argv[1:] if argv is None else argv)
    if not {"-h", "--help"} & set(args):
        # A bad setting, a missing Redis client or a Redis that refuses us stops the sidecar
        # in a second, before the ~20 s of importing vLLM and torch (checked again below with
        # vLLM's parser, which also refuses an engine argument it does not know).
        _, url, tls = _settings(own_flags(args))
        try:
            connect(url, tls)  # no connection yet: the loops make it
        except ImportError:
            print(f"{PROG}: needs the Redis client: pip install {REDIS_EXTRA}", file=sys.stderr)
            raise SystemExit(2) from None
        check_at_start(url, tls)
    from smg_servicer_vllm.mm_sidecar import jobs  # noqa: PLC0415 - vLLM and torch, once Redis said yes

    namespace = jobs.build_parser().parse_args(args)
    resolved, url, tls = _settings(namespace)
    redis = connect(url, tls)
    namespace.redis_url = url  # vLLM may log the namespace: the URL's repr hides its password

    logger.info("building vLLM's configuration and processor for %s", namespace.model)
    processor = jobs.processor_for(namespace, resolved)
    if processor is None:
        print(f"{PROG}: {namespace.model} accepts no media; nothing to serve", file=sys.stderr)
        raise SystemExit(2)
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
    asyncio.run(jobs.serve(sidecar))

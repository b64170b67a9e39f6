"""The sidecar's own settings, engine-free. ``--redis-url``, ``--redis-ca-file``,
``--redis-cert-file``, ``--redis-key-file`` and ``--namespace`` are the worker's
``--mm-redis-url`` / ``--mm-redis-{ca,cert,key}-file`` / ``--mm-sidecar-namespace`` settings under
the sidecar's flag names: the same variables (``SMG_VLLM_MM_REDIS_URL``,
``SMG_VLLM_MM_REDIS_CA_FILE``, ..., ``SMG_VLLM_MM_SIDECAR_NAMESPACE``), the same parsing and
checks, so the two processes cannot resolve them differently. ``--allow-private-media-hosts`` is
the worker's ``--mm-allow-private-media-hosts`` (``SMG_VLLM_MM_ALLOW_PRIVATE_MEDIA_HOSTS``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from smg_servicer_core.config import Setting
from smg_servicer_mm_sidecar.protocol import DEFAULT_MAX_RESULT_BYTES
from smg_servicer_vllm.mm_settings import SETTINGS as WORKER_SETTINGS

_WORKER = {s.name: s for s in WORKER_SETTINGS}


def _positive(value: int) -> str | None:
    return None if value > 0 else "must be a positive integer"


#: The command users run (the facade's), as the sidecar's messages name it.
PROG = "python -m smg_grpc_servicer.vllm.mm_sidecar"
#: How the sidecar's refusals name its private-hosts opt-in.
OPT_IN_FLAG = "--allow-private-media-hosts"
#: The names of the TLS files in the sidecar's messages (the worker's are ``--mm-redis-*``).
TLS_FLAGS = ("--redis-ca-file", "--redis-cert-file", "--redis-key-file")

SETTINGS: tuple[Setting[Any], ...] = (
    dataclasses.replace(_WORKER["mm_redis_url"], name="redis_url", flag="--redis-url"),
    *(
        dataclasses.replace(_WORKER[f"mm_redis_{kind}_file"], name=f"redis_{kind}_file", flag=flag)
        for kind, flag in zip(("ca", "cert", "key"), TLS_FLAGS, strict=True)
    ),
    dataclasses.replace(
        _WORKER["mm_sidecar_namespace"],
        name="namespace",
        flag="--namespace",
        help="the key namespace (default: derived from the model fingerprint, as the worker does)",
    ),
    Setting(
        "concurrency", int, 2, "jobs processed at once", flag="--concurrency", validate=_positive
    ),
    Setting(
        "max_result_bytes",
        int,
        DEFAULT_MAX_RESULT_BYTES,
        "the largest encoded result (lowered to Redis's proto-max-bulk-len)",
        env="SMG_VLLM_MM_MAX_RESULT_BYTES",
        validate=_positive,
    ),
    _WORKER["mm_max_video_frames"],
    dataclasses.replace(
        _WORKER["mm_allow_private_media_hosts"],
        name="allow_private_media_hosts",
        flag="--allow-private-media-hosts",
    ),
)

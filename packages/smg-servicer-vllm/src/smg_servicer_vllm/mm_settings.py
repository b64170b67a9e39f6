"""``MmSettings``: the worker-side multimodal settings of a vLLM gRPC worker. Engine-free.

Eight settings have a flag (``--mm-*``, added to vLLM's gRPC parsers by the plugin) and a
deprecated ``SMG_VLLM_MM_*`` variable; the three files of a ``rediss://`` link have a flag and a
current variable (they are new; the sidecar reads the same ones); ``SMG_VLLM_MM_MAX_VIDEO_FRAMES``
is a variable only. Each resolves flag > environment (one deprecation line for a deprecated
variable) > default, and every one is parsed and validated at start whatever the processor mode,
so a stale unreadable value fails the start (:class:`~smg_servicer_core.errors.ConfigError`: one
line, exit 2) instead of the first request.

=========================  ==================================  =============================
flag                       variable                            default
=========================  ==================================  =============================
``--mm-processor``         ``SMG_VLLM_MM_PROCESSOR``           ``off`` (``inprocess``, ``redis``)
``--mm-max-inflight``      ``SMG_VLLM_MM_MAX_INFLIGHT``        64 concurrent media jobs
``--mm-max-items``         ``SMG_VLLM_MM_MAX_ITEMS``           unset: the model's limits
``--mm-max-item-bytes``    ``SMG_VLLM_MM_MAX_ITEM_BYTES``      32 MiB per inline ``data:`` item
``--mm-redis-url``         ``SMG_VLLM_MM_REDIS_URL``           ``redis://127.0.0.1:6379/0``
``--mm-sidecar-timeout-ms``  ``SMG_VLLM_MM_SIDECAR_TIMEOUT_MS``  30000
``--mm-sidecar-max-queue``   ``SMG_VLLM_MM_SIDECAR_MAX_QUEUE``   256
``--mm-sidecar-namespace``   ``SMG_VLLM_MM_SIDECAR_NAMESPACE``   derived from the fingerprint
``--mm-redis-ca-file``       ``SMG_VLLM_MM_REDIS_CA_FILE``       unset: the system's CAs
``--mm-redis-cert-file``     ``SMG_VLLM_MM_REDIS_CERT_FILE``     unset: no client certificate
``--mm-redis-key-file``      ``SMG_VLLM_MM_REDIS_KEY_FILE``      unset (with the certificate)
—                          ``SMG_VLLM_MM_MAX_VIDEO_FRAMES``    0 (vLLM's ``--media-io-kwargs``)
=========================  ==================================  =============================

``--mm-allow-private-media-hosts`` (variable ``SMG_VLLM_MM_ALLOW_PRIVATE_MEDIA_HOSTS``, default
off) lets media URLs reach loopback and link-local hosts, which are refused by default
(:mod:`smg_servicer_vllm.media_guard`); the sidecar reads the same variable (its flag:
``--allow-private-media-hosts``).

``--mm-max-items`` is either one count for every modality (``4``) or per modality
(``image=4,video=1``).

The Redis URL may carry an ACL user and password (``rediss://user:password@host:port/db``); it
is held as a :class:`RedisUrl`, whose ``repr`` (logs, ``describe()``, config errors, vLLM's own
log of its parsed arguments) shows ``user:***@``. The TLS files need a ``rediss://`` URL, and the
certificate and key go together (:func:`redis_tls`).
"""

from __future__ import annotations

import argparse
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from smg_servicer_core.config import Setting, Source, Switch, parse_bool, resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_mm_sidecar.client import RedisTls

Mode = Literal["off", "inprocess", "redis"]
MODES: tuple[Mode, ...] = ("off", "inprocess", "redis")
MODALITIES = ("image", "video", "audio")
MiB = 1 << 20


def _mode(raw: str) -> Mode:
    value = raw.strip().lower()
    if value == "smg":
        raise ValueError("'smg' is the router's own processor, not a worker mode")
    for mode in MODES:
        if value == mode:
            return mode
    raise ValueError(f"expected one of {', '.join(MODES)}")


def _positive(value: int | None) -> str | None:
    return None if value is None or value > 0 else "must be a positive integer"


def _not_negative(value: int) -> str | None:
    return None if value >= 0 else "must be 0 or a positive integer"


def parse_item_limits(raw: str) -> dict[str, int]:
    """``"4"`` (every modality) or ``"image=4,video=1"`` -> ``{modality: count}``."""
    text = raw.strip()
    if re.fullmatch(r"\d+", text):
        return dict.fromkeys(MODALITIES, int(text))
    limits: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in MODALITIES or not re.fullmatch(r"\s*\d+\s*", count):
            raise ValueError("expected a count or modality=count pairs such as image=4,video=1")
        if name in limits:
            raise ValueError(f"{name} is given twice")
        limits[name] = int(count)
    return limits


def _limits_valid(value: Mapping[str, int] | None) -> str | None:
    if value is not None and any(count <= 0 for count in value.values()):
        return "every count must be positive"
    return None


class RedisUrl(str):
    """A Redis URL whose ``repr`` hides its password (``user:***@``); ``str()`` is the URL."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact_url(str(self)))


def _redis_url(raw: str) -> RedisUrl:
    """Any text: the checks are in :func:`_redis_url_problem`, whose message core shows with
    the value's ``repr`` (redacted), where a parse error would show the raw text."""
    return RedisUrl(raw.strip())


def _redis_url_problem(value: str) -> str | None:
    try:
        parts = urlsplit(value)
        _ = parts.port  # a port that is not a number raises
    except ValueError:
        return "expected a redis://, rediss:// or unix:// URL"
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.netloc or parts.path):
        return "expected a redis://, rediss:// or unix:// URL"
    return None


def _pem_file(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if not os.path.isfile(value):
        raise ValueError("no such file")
    if not os.access(value, os.R_OK):
        raise ValueError("the file is not readable")
    return value


def _namespace(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", value):
        raise ValueError("expected 1-64 characters from A-Z a-z 0-9 _ . -")
    return value


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``user:***@host``, for logs and labels);
    a URL that cannot be read is replaced whole."""
    try:
        parts = urlsplit(str(url))
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<an unreadable URL>"
    if parts.password is None:
        return str(url)
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def redis_tls(
    url: str,
    tls: RedisTls,
    flags: tuple[str, str, str] = (
        "--mm-redis-ca-file",
        "--mm-redis-cert-file",
        "--mm-redis-key-file",
    ),
) -> RedisTls:
    """``tls`` checked against ``url`` (``flags``: the names of its three files in messages):
    the files need a ``rediss://`` URL, the certificate and key go together, the CA file holds
    certificates and the key matches the certificate. Raises ``ConfigError`` (one line)."""
    ca, cert, key = flags
    paths = (tls.ca_file, tls.cert_file, tls.key_file)
    given = [flag for flag, path in zip(flags, paths, strict=True) if path]
    if given and urlsplit(str(url)).scheme != "rediss":
        raise ConfigError(f"{', '.join(given)}: needs a rediss:// URL (got {redact_url(url)})")
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError(f"{cert} and {key} go together")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if tls.ca_file:
            context.load_verify_locations(cafile=tls.ca_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"{ca}: not a PEM CA certificate ({tls.ca_file}: {exc})") from None
    try:
        if tls.cert_file and tls.key_file:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            f"{cert}/{key}: not a PEM certificate and its key ({tls.cert_file}: {exc})"
        ) from None
    return tls


SETTINGS: tuple[Setting[Any], ...] = (
    Setting(
        "mm_processor",
        _mode,
        "off",
        "worker-side media processing: off, inprocess or redis",
        flag="--mm-processor",
        env="SMG_VLLM_MM_PROCESSOR",
        env_deprecated=True,
    ),
    Setting(
        "mm_max_inflight",
        int,
        64,
        "concurrent media jobs (media refs and preprocessed tensors); beyond it UNAVAILABLE",
        flag="--mm-max-inflight",
        env="SMG_VLLM_MM_MAX_INFLIGHT",
        env_deprecated=True,
        validate=_positive,
    ),
    Setting(
        "mm_max_items",
        parse_item_limits,
        None,
        "media items per request: N or image=N,video=M (unset: the model's limits)",
        flag="--mm-max-items",
        env="SMG_VLLM_MM_MAX_ITEMS",
        env_deprecated=True,
        validate=_limits_valid,
    ),
    Setting(
        "mm_max_item_bytes",
        int,
        32 * MiB,
        "the largest decoded inline data: item, in bytes",
        flag="--mm-max-item-bytes",
        env="SMG_VLLM_MM_MAX_ITEM_BYTES",
        env_deprecated=True,
        validate=_positive,
    ),
    Setting(
        "mm_redis_url",
        _redis_url,
        "redis://127.0.0.1:6379/0",
        "the Redis of the multimodal sidecar (--mm-processor redis)",
        flag="--mm-redis-url",
        env="SMG_VLLM_MM_REDIS_URL",
        env_deprecated=True,
        validate=_redis_url_problem,
    ),
    Setting(
        "mm_redis_ca_file",
        _pem_file,
        None,
        "the CA (PEM) that verifies a rediss:// server (unset: the system's CAs)",
        flag="--mm-redis-ca-file",
        env="SMG_VLLM_MM_REDIS_CA_FILE",
    ),
    Setting(
        "mm_redis_cert_file",
        _pem_file,
        None,
        "the client certificate (PEM) for a Redis with tls-auth-clients",
        flag="--mm-redis-cert-file",
        env="SMG_VLLM_MM_REDIS_CERT_FILE",
    ),
    Setting(
        "mm_redis_key_file",
        _pem_file,
        None,
        "the key (PEM) of --mm-redis-cert-file",
        flag="--mm-redis-key-file",
        env="SMG_VLLM_MM_REDIS_KEY_FILE",
    ),
    Setting(
        "mm_sidecar_timeout_ms",
        int,
        30000,
        "how long a media job may take in the sidecar, in milliseconds",
        flag="--mm-sidecar-timeout-ms",
        env="SMG_VLLM_MM_SIDECAR_TIMEOUT_MS",
        env_deprecated=True,
        validate=_positive,
    ),
    Setting(
        "mm_sidecar_max_queue",
        int,
        256,
        "the sidecar job queue depth beyond which requests fail fast with UNAVAILABLE",
        flag="--mm-sidecar-max-queue",
        env="SMG_VLLM_MM_SIDECAR_MAX_QUEUE",
        env_deprecated=True,
        validate=_positive,
    ),
    Setting(
        "mm_sidecar_namespace",
        _namespace,
        None,
        "the sidecar key namespace (default: derived from the model fingerprint)",
        flag="--mm-sidecar-namespace",
        env="SMG_VLLM_MM_SIDECAR_NAMESPACE",
        env_deprecated=True,
    ),
    Setting(
        "mm_max_video_frames",
        int,
        0,
        "frames a video is sampled to at most (0: vLLM's --media-io-kwargs decide)",
        env="SMG_VLLM_MM_MAX_VIDEO_FRAMES",
        validate=_not_negative,
    ),
    Switch(
        "mm_allow_private_media_hosts",
        parse_bool,
        False,
        "let media URLs reach loopback and link-local hosts (refused by default: SSRF); cloud "
        "metadata, unspecified and multicast addresses stay refused",
        flag="--mm-allow-private-media-hosts",
        env="SMG_VLLM_MM_ALLOW_PRIVATE_MEDIA_HOSTS",
    ),
)
FLAG_BACKED = tuple(s for s in SETTINGS if s.flag is not None)


@dataclass(frozen=True)
class MmSettings:
    """What ``VllmEngineServicer(async_llm, start_time, mm_settings)`` is given."""

    processor: Mode = "off"
    max_inflight: int = 64
    max_items: Mapping[str, int] | None = None
    max_item_bytes: int = 32 * MiB
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_ca_file: str | None = None
    redis_cert_file: str | None = None
    redis_key_file: str | None = None
    sidecar_timeout_ms: int = 30000
    sidecar_max_queue: int = 256
    sidecar_namespace: str | None = None
    max_video_frames: int = 0
    allow_private_media_hosts: bool = False
    #: Where ``processor`` came from: ``flag``, ``env`` or ``default``.
    source: Source = "default"
    sources: Mapping[str, Source] = field(default_factory=dict[str, Source])

    def __post_init__(self) -> None:
        object.__setattr__(self, "redis_url", RedisUrl(self.redis_url))  # a redacted repr
        for setting in SETTINGS:
            raw = getattr(self, setting.name.removeprefix("mm_"))
            problem = setting.validate(raw) if setting.validate else None
            if problem:
                raise ValueError(f"MmSettings.{setting.name.removeprefix('mm_')}: {problem}")
        if self.processor not in MODES:
            raise ValueError(f"MmSettings.processor must be one of {', '.join(MODES)}")

    @property
    def tls(self) -> RedisTls:
        """The files of a ``rediss://`` link to the sidecar's Redis."""
        return RedisTls(self.redis_ca_file, self.redis_cert_file, self.redis_key_file)

    def describe(self) -> str:
        """One line for the log, the Redis URL redacted."""
        parts: list[str] = []
        for setting in SETTINGS:
            name = setting.name.removeprefix("mm_")
            value: Any = getattr(self, name)
            parts.append(f"{name}={value!r} ({self.sources.get(name, 'default')})")
        return ", ".join(parts)


def add_flags(parser: argparse.ArgumentParser | Any) -> None:
    """The ``--mm-*`` flags (``default=None``: an absent flag falls back to the variable)."""
    group = parser.add_argument_group("SMG worker-side multimodal (smg-servicer-vllm)")
    for setting in FLAG_BACKED:
        setting.add_to_parser(group)


def resolve_mm_settings(
    namespace: argparse.Namespace | None, environ: Mapping[str, str]
) -> MmSettings:
    """Flag > environment > default for every setting; raises ``ConfigError`` on a bad value."""
    resolved = resolve(SETTINGS, namespace, environ)
    values = {name.removeprefix("mm_"): resolved[name] for name in resolved}
    sources: dict[str, Source] = {
        name.removeprefix("mm_"): resolved.source(name) for name in resolved
    }
    settings = MmSettings(**values, source=resolved.source("mm_processor"), sources=sources)
    redis_tls(settings.redis_url, settings.tls)
    return settings

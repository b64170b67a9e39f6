"""The worker <-> sidecar protocol, schema v1. Engine-free: msgspec only (no vLLM, no Redis).

Keys live under ``smg:mm:v1:{namespace}``:

- ``:hello`` — a hash the sidecar rewrites every :data:`HELLO_INTERVAL_S` with a TTL of
  :data:`HELLO_TTL_S` (one MULTI): the :class:`Fingerprint` fields plus ``schema``, ``schemes``,
  ``started_at``, ``settings_source`` and ``max_result_bytes``;
- ``:jobs`` — a list: the worker LPUSHes a :class:`Job`, the sidecar BRPOPs it;
- ``:res:{job_id}`` — a list: the sidecar LPUSHes the :class:`JobResult` and sets its TTL of
  :data:`RESULT_TTL_S` in one MULTI; the worker BRPOPs it (the pop removes the key).

The namespace is the first 16 hex digits of the SHA-256 of the fingerprint fields joined by
``|``, unless an operator gives one. Both sides derive it the same way, so a worker and a
sidecar that disagree on the model, vLLM version, dtype, video backend, media/processor kwargs
or the per-modality item limits never share a queue. Each job carries its deadline; a job
found past it is dropped unprocessed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

SCHEMA = 1
PREFIX = f"smg:mm:v{SCHEMA}"
HELLO_INTERVAL_S = 5.0
HELLO_TTL_S = 15
RESULT_TTL_S = 120
#: The sidecar's BRPOP on the job list waits this long, then re-checks for shutdown.
JOB_POLL_S = 5.0
#: The outer bound on that wait, over the server-side timeout.
JOB_POLL_MARGIN_S = 2.0
#: Every control call (probe, queue depth, push) is bounded by this.
CONTROL_TIMEOUT_S = 1.0
DEFAULT_MAX_RESULT_BYTES = 512 << 20
MODALITIES = ("audio", "image", "video")

# Error codes a result (or the worker's own wait) carries. -------------------------------------
#: The request's fault: INVALID_ARGUMENT.
CLIENT_CODES = frozenset(
    {
        "fetch_failed",
        "domain_not_allowed",
        "scheme_not_accepted",
        "limit_exceeded",
        "decode_failed",
        "placeholder_mismatch",
    }
)
#: Worth another attempt (elsewhere or later): UNAVAILABLE. ``fetch_unavailable`` is a media host
#: that answered 5xx, timed out or could not be reached (the in-process path's UNAVAILABLE too).
RETRYABLE_CODES = frozenset(
    {"expired", "processor_error", "fingerprint_mismatch", "fetch_unavailable"}
)
RESULT_TOO_LARGE = "result_too_large"
RESULT_PUSH_FAILED = "result_push_failed"
#: The worker's own outcomes while waiting for a result.
SIDECAR_OVERLOADED = "sidecar_overloaded"
SIDECAR_TIMEOUT = "sidecar_timeout"
SIDECAR_UNAVAILABLE = "sidecar_unavailable"
SIDECAR_PROTOCOL = "sidecar_protocol"

Status = Literal["INVALID_ARGUMENT", "UNAVAILABLE", "INTERNAL"]


def status_for(code: str) -> Status:
    """The gRPC status name a worker answers ``code`` with.

    A sidecar timeout is INTERNAL, which the router does not retry: the worker already spent the
    request's whole media budget waiting, and a retry would spend it again."""
    if code in CLIENT_CODES or code == RESULT_TOO_LARGE:
        return "INVALID_ARGUMENT"
    if code == SIDECAR_TIMEOUT:
        return "INTERNAL"
    return "UNAVAILABLE"


def client_message(code: str, message: str) -> str:
    """The message a client sees: ``media_too_large: …`` for an over-cap result, else
    ``<code>: <message>``."""
    if code == RESULT_TOO_LARGE:
        return f"media_too_large: {message}"
    return f"{code}: {message}"


class SidecarError(Exception):
    """A job that ended without tensors: its protocol ``code`` and a client-safe message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def status(self) -> Status:
        return status_for(self.code)


# Fingerprint and namespace ----------------------------------------------------------------------


class Fingerprint(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What a worker and a sidecar must agree on, every field a string (order is the hash order)."""

    model: str
    vllm_version: str
    dtype: str
    video_backend: str
    media_io_kwargs: str
    mm_processor_kwargs: str
    limit_per_prompt: str

    def fields(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.__struct_fields__}


FINGERPRINT_FIELDS: tuple[str, ...] = Fingerprint.__struct_fields__


def sorted_json(value: Any) -> str:
    """A canonical JSON spelling (sorted keys, no spaces; ``{}`` for nothing)."""
    return json.dumps(value or {}, sort_keys=True, separators=(",", ":"), default=str)


def limit_string(limits: Mapping[str, int | None]) -> str:
    """The per-modality item limits, canonical: ``image=2,video=*`` (``*`` = the unset
    default); ``*`` alone when no modality is set. Equivalent spellings of the flag resolve to
    the same counts before they get here, so they give the same string."""
    if all(limits.get(m) is None for m in MODALITIES):
        return "*"
    return ",".join(
        f"{m}={'*' if limits.get(m) is None else int(limits[m])}"  # pyright: ignore[reportArgumentType]
        for m in MODALITIES
    )


def namespace_for(fingerprint: Fingerprint, override: str | None = None) -> str:
    """``override`` (trimmed) when given, else 16 hex digits of the fingerprint's SHA-256."""
    if override is not None and override.strip():
        return override.strip()
    joined = "|".join(fingerprint.fields().values())
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def mismatches(ours: Fingerprint, theirs: Fingerprint) -> list[str]:
    """The names of the fields that differ."""
    return [n for n in FINGERPRINT_FIELDS if getattr(ours, n) != getattr(theirs, n)]


class Keys:
    """The Redis keys of one namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.base = f"{PREFIX}:{namespace}"
        self.hello = f"{self.base}:hello"
        self.jobs = f"{self.base}:jobs"
        self.results_pattern = f"{self.base}:res:*"

    def result(self, job_id: str) -> str:
        return f"{self.base}:res:{job_id}"


# Hello ------------------------------------------------------------------------------------------


class Hello(msgspec.Struct, frozen=True):
    fingerprint: Fingerprint
    schema: int
    schemes: tuple[str, ...]
    started_at: float
    settings_source: str
    max_result_bytes: int


def hello_fields(hello: Hello) -> dict[str, str]:
    """The hash a sidecar writes."""
    return hello.fingerprint.fields() | {
        "schema": str(hello.schema),
        "schemes": ",".join(hello.schemes),
        "started_at": repr(hello.started_at),
        "settings_source": hello.settings_source,
        "max_result_bytes": str(hello.max_result_bytes),
    }


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def parse_hello(raw: Mapping[Any, Any]) -> Hello | None:
    """A hello read back (bytes or str keys and values); None when a field is missing or
    unreadable."""
    fields = {_text(k): _text(v) for k, v in raw.items()}
    try:
        return Hello(
            fingerprint=Fingerprint(**{n: fields[n] for n in FINGERPRINT_FIELDS}),
            schema=int(fields["schema"]),
            schemes=tuple(s for s in fields["schemes"].split(",") if s),
            started_at=float(fields["started_at"]),
            settings_source=fields["settings_source"],
            max_result_bytes=int(fields["max_result_bytes"]),
        )
    except (KeyError, ValueError):
        return None


# Jobs and results -------------------------------------------------------------------------------


class JobItem(msgspec.Struct, frozen=True):
    modality: str
    url: str


class Job(msgspec.Struct, frozen=True):
    v: int
    job_id: str
    request_id: str
    fingerprint: Fingerprint
    prompt_token_ids: list[int]
    prompt: str | None
    items: list[JobItem]
    enqueued_ms: int
    deadline_ms: int


class Placeholder(msgspec.Struct, frozen=True):
    offset: int
    length: int
    is_embed: list[bool] | None = None


class Timing(msgspec.Struct, frozen=True):
    queue_ms: float = 0.0
    fetch_ms: float = 0.0
    process_ms: float = 0.0


class JobResult(msgspec.Struct, frozen=True):
    v: int
    job_id: str
    ok: bool
    fingerprint: Fingerprint | None = None
    prompt_token_ids: list[int] = msgspec.field(default_factory=list[int])
    mm_hashes: dict[str, list[str]] = msgspec.field(default_factory=dict[str, list[str]])
    mm_placeholders: dict[str, list[Placeholder]] = msgspec.field(
        default_factory=dict[str, list[Placeholder]]
    )
    #: One ``MsgpackEncoder(size_threshold=2**62)`` buffer of a ``MultiModalKwargsItem`` each.
    mm_kwargs: dict[str, list[bytes]] = msgspec.field(default_factory=dict[str, list[bytes]])
    code: str = ""
    message: str = ""
    timing: Timing = msgspec.field(default_factory=Timing)
    cache: str = ""


def failure(job_id: str, code: str, message: str, **extra: Any) -> JobResult:
    return JobResult(v=SCHEMA, job_id=job_id, ok=False, code=code, message=message, **extra)


_encoder = msgspec.msgpack.Encoder()
_job_decoder = msgspec.msgpack.Decoder(Job)
_result_decoder = msgspec.msgpack.Decoder(JobResult)


def encode(message: Job | JobResult) -> bytes:
    return _encoder.encode(message)


def _decoded(decoder: msgspec.msgpack.Decoder[Any], raw: bytes, what: str) -> Any:
    try:
        message = decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise SidecarError(SIDECAR_PROTOCOL, f"the {what} cannot be decoded") from exc
    if message.v != SCHEMA:
        raise SidecarError(SIDECAR_PROTOCOL, f"the {what} has schema {message.v}, not {SCHEMA}")
    return message


def decode_job(raw: bytes) -> Job:
    return _decoded(_job_decoder, raw, "job")


def decode_result(raw: bytes) -> JobResult:
    return _decoded(_result_decoder, raw, "result")


def code_sets() -> Iterable[frozenset[str]]:
    """Every code family (disjoint)."""
    return (
        CLIENT_CODES,
        RETRYABLE_CODES,
        frozenset({RESULT_TOO_LARGE, RESULT_PUSH_FAILED}),
        frozenset({SIDECAR_OVERLOADED, SIDECAR_TIMEOUT, SIDECAR_UNAVAILABLE, SIDECAR_PROTOCOL}),
    )

"""The worker's side of the protocol: probe the sidecar's hello, submit a job, wait for its result.

Needs ``redis`` (``pip install 'smg-servicer-mm-sidecar[redis]'``), not vLLM. Every control call
(HGETALL, LLEN, LPUSH, cleanup) is bounded by :data:`~.protocol.CONTROL_TIMEOUT_S`; the wait for
a result by the job's own timeout plus one second. Failures raise
:class:`~.protocol.SidecarError` with the protocol code the worker maps to a gRPC status:

=======================  =================================================  ===============
code                     when                                               status
=======================  =================================================  ===============
``sidecar_unavailable``  Redis unreachable, or no sidecar with our          UNAVAILABLE
                         fingerprint keeps ``hello`` alive
``sidecar_overloaded``   the job list is at ``--mm-sidecar-max-queue``      UNAVAILABLE
``sidecar_timeout``      no result before the job's deadline                INTERNAL (not
                                                                            retried)
``sidecar_protocol``     an undecodable result, another schema or job id    UNAVAILABLE
``fingerprint_mismatch`` a result made for another configuration            UNAVAILABLE
=======================  =================================================  ===============

Both sides connect with :func:`connect` (``rediss://`` is TLS; :class:`RedisTls` names the CA
that verifies the server and a client certificate for ``tls-auth-clients yes``) and check the
link once at start with :func:`check_redis`: credentials or TLS that Redis refuses raise
:class:`RedisRejected` (a configuration error: the launchers exit 2), while a Redis that cannot be
reached yet is only reported (it may come up later; requests are UNAVAILABLE meanwhile). No
message here carries the URL: the callers name it with its password redacted.

A result with ``ok=False`` raises its own code. A job given up (timeout, cancel) is taken back
from the queue and its result key deleted in the background, so the sidecar skips the work and
no key outlives the wait; a result pushed after that expires with its TTL.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from smg_servicer_mm_sidecar.protocol import (
    CONTROL_TIMEOUT_S,
    SCHEMA,
    SIDECAR_OVERLOADED,
    SIDECAR_PROTOCOL,
    SIDECAR_TIMEOUT,
    SIDECAR_UNAVAILABLE,
    Fingerprint,
    Hello,
    Job,
    JobItem,
    JobResult,
    Keys,
    SidecarError,
    decode_result,
    encode,
    mismatches,
    namespace_for,
    parse_hello,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: A probe younger than this is reused (GetServerInfo and Generate may call it often).
PROBE_MAX_AGE_S = 1.0


#: The start-up check's bound on connecting, the TLS handshake and the PING.
CHECK_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RedisTls:
    """The files of a ``rediss://`` link (PEM paths; ``None``: not given). ``ca_file`` verifies
    the server's certificate (unset: the system's CAs); ``cert_file`` and ``key_file`` are the
    client certificate a Redis with ``tls-auth-clients yes`` asks for. The server's name is
    always checked against its certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def client_options(self) -> dict[str, Any]:
        """redis-py's ``ssl_*`` options for the files given."""
        named = {
            "ssl_ca_certs": self.ca_file,
            "ssl_certfile": self.cert_file,
            "ssl_keyfile": self.key_file,
        }
        return {key: value for key, value in named.items() if value}


class RedisRejected(Exception):
    """Redis refused this client for a reason no retry mends: the user name or password, the
    ACL, or the TLS handshake (a server certificate the CA does not verify, a client
    certificate refused, TLS spoken to a plain port). The message is one line, without the URL."""


def connect(url: str, tls: RedisTls | None = None) -> Any:
    """An asyncio Redis client for ``url`` as both sides use it (1 s connect, no read timeout:
    the blocking pops carry their own bound); ``tls``: the files of a ``rediss://`` link."""
    import redis.asyncio  # noqa: PLC0415 - the protocol module must import without redis

    options = tls.client_options() if tls is not None else {}
    return redis.asyncio.Redis.from_url(  # pyright: ignore[reportUnknownMemberType]
        url, socket_connect_timeout=1, socket_timeout=None, decode_responses=False, **options
    )


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure behind a redis-py error (it raises its own ConnectionError in the
    ``except`` block of the socket's, so the SSL error is the context)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_reason(error: ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"the server's certificate does not verify: {error.verify_message}"
    reason = error.reason or type(error).__name__
    # Without a client certificate a server that demands one alerts or, as often, just closes.
    if "CERTIFICATE_REQUIRED" in reason or isinstance(error, ssl.SSLEOFError):
        return f"{reason}: a Redis with tls-auth-clients asks for a client certificate"
    return reason


def check_redis(
    url: str, tls: RedisTls | None = None, timeout_s: float = CHECK_TIMEOUT_S
) -> str | None:
    """One PING over a synchronous connection made as :func:`connect` makes it (TLS, user,
    password, db), no retry. ``None``: Redis answered. A short reason: Redis cannot be reached
    now (refused, timed out, closed). Raises :class:`RedisRejected` when it refused us."""
    import redis  # noqa: PLC0415
    from redis.backoff import NoBackoff  # noqa: PLC0415
    from redis.exceptions import (  # noqa: PLC0415
        AuthenticationError,
        AuthenticationWrongNumberOfArgsError,
        NoPermissionError,
        RedisError,
    )
    from redis.retry import Retry  # noqa: PLC0415

    options = tls.client_options() if tls is not None else {}
    client: Any = redis.Redis.from_url(  # pyright: ignore[reportUnknownMemberType]
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        **options,
    )
    try:
        client.ping()
    except (AuthenticationError, AuthenticationWrongNumberOfArgsError) as exc:
        raise RedisRejected(f"Redis refused the user name or password ({exc})") from None
    except NoPermissionError as exc:
        raise RedisRejected(f"the Redis user may not run PING ({exc})") from None
    except (RedisError, OSError) as exc:
        tls_error = _ssl_error(exc)
        if tls_error is not None:
            raise RedisRejected(f"the TLS handshake failed ({_tls_reason(tls_error)})") from None
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        client.close()
    return None


def transport_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError  # noqa: PLC0415

    return (RedisError, OSError, asyncio.TimeoutError)


async def bounded(call: Awaitable[T], timeout_s: float = CONTROL_TIMEOUT_S) -> T:
    """``call`` within ``timeout_s`` (``asyncio.TimeoutError`` past it; no extra task on 3.11+,
    where ``asyncio.timeout`` exists)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await call
    return await asyncio.wait_for(call, timeout_s)


class SidecarClient:
    """One worker's connection to its sidecar."""

    def __init__(
        self,
        redis: Any,
        fingerprint: Fingerprint,
        *,
        namespace: str | None = None,
        timeout_ms: int = 30000,
        max_queue: int = 256,
    ) -> None:
        self.redis = redis
        self.fingerprint = fingerprint
        self.namespace = namespace_for(fingerprint, namespace)
        self.keys = Keys(self.namespace)
        self.timeout_ms = timeout_ms
        self.max_queue = max_queue
        self.hello: Hello | None = None
        self._probed_at = -1e9
        self._probe_lock = asyncio.Lock()
        self._last_problem = ""
        self._cleanups: set[asyncio.Task[None]] = set()
        self._errors = transport_errors()

    # Probe ------------------------------------------------------------------------------------

    async def probe(self, max_age_s: float = PROBE_MAX_AGE_S) -> Hello | None:
        """The matching sidecar's hello, or None (read again when older than ``max_age_s``)."""
        if time.monotonic() - self._probed_at < max_age_s:
            return self.hello
        async with self._probe_lock:
            if time.monotonic() - self._probed_at < max_age_s:
                return self.hello
            self.hello, problem = await self._read_hello()
            self._probed_at = time.monotonic()
        if problem != self._last_problem:  # each change of state is logged once
            if problem:
                logger.warning("multimodal sidecar not advertised: %s", problem)
            else:
                logger.info(
                    "multimodal sidecar found (namespace %s, schemes %s)",
                    self.namespace,
                    ",".join(self.hello.schemes if self.hello else ()),
                )
            self._last_problem = problem
        return self.hello

    async def _read_hello(self) -> tuple[Hello | None, str]:
        try:
            raw = await bounded(self.redis.hgetall(self.keys.hello))
        except self._errors as exc:
            return None, f"Redis cannot be reached ({type(exc).__name__})"
        if not raw:
            return None, (
                f"no sidecar keeps {self.keys.hello} alive (a sidecar started for another "
                "model, vLLM version, dtype, video backend, media/processor kwargs or "
                "--limit-mm-per-prompt uses another namespace)"
            )
        hello = parse_hello(raw)
        if hello is None:
            return None, "the sidecar's hello is unreadable"
        if hello.schema != SCHEMA:
            return None, f"the sidecar speaks schema {hello.schema}, not {SCHEMA}"
        differ = mismatches(self.fingerprint, hello.fingerprint)
        if differ:
            return None, f"the sidecar's fingerprint differs in {', '.join(differ)}"
        return hello, ""

    @property
    def advertised(self) -> bool:
        return self.hello is not None

    def forget_hello(self) -> None:
        self._probed_at = -1e9

    # Submit -----------------------------------------------------------------------------------

    async def submit(
        self, request_id: str, ids: Sequence[int], prompt: str | None, items: Sequence[JobItem]
    ) -> JobResult:
        """One job's successful result; anything else raises :class:`SidecarError`."""
        if await self.probe() is None:
            raise SidecarError(
                SIDECAR_UNAVAILABLE, "no multimodal sidecar for this model is running"
            )
        now_ms = int(time.time() * 1000)
        job = Job(
            v=SCHEMA,
            job_id=uuid.uuid4().hex,
            request_id=request_id,
            fingerprint=self.fingerprint,
            prompt_token_ids=list(ids),
            prompt=prompt,
            items=list(items),
            enqueued_ms=now_ms,
            deadline_ms=now_ms + self.timeout_ms,
        )
        payload = encode(job)
        result_key = self.keys.result(job.job_id)
        queued = done = False
        try:
            depth = int(await bounded(self.redis.llen(self.keys.jobs)))
            if depth >= self.max_queue:
                raise SidecarError(
                    SIDECAR_OVERLOADED,
                    f"the sidecar queue holds {depth} jobs (limit {self.max_queue})",
                )
            await bounded(self.redis.lpush(self.keys.jobs, payload))
            queued = True
            reply = await self._wait(result_key)
            done = True
        except SidecarError:
            raise
        except self._errors as exc:
            self.forget_hello()
            raise SidecarError(
                SIDECAR_UNAVAILABLE, "the sidecar's Redis cannot be reached"
            ) from exc
        finally:
            if queued and not done:
                self._clean_up(payload, result_key)
        return self._checked(job.job_id, reply)

    async def _wait(self, result_key: str) -> bytes:
        timeout_s = self.timeout_ms / 1000
        try:
            reply = await asyncio.wait_for(
                self.redis.brpop([result_key], timeout=timeout_s), timeout_s + 1
            )
        except asyncio.TimeoutError:  # not the builtin TimeoutError before 3.11
            reply = None
        if reply is None:
            raise SidecarError(
                SIDECAR_TIMEOUT, f"the sidecar gave no result within {self.timeout_ms} ms"
            )
        return reply[1]

    def _checked(self, job_id: str, raw: bytes) -> JobResult:
        result = decode_result(raw)
        if result.job_id != job_id:
            raise SidecarError(SIDECAR_PROTOCOL, "the result answers another job")
        if result.fingerprint is not None and result.fingerprint != self.fingerprint:
            self.forget_hello()
            logger.warning(
                "a sidecar result was made for another configuration (%s); rejected",
                ", ".join(mismatches(self.fingerprint, result.fingerprint)),
            )
            raise SidecarError(
                "fingerprint_mismatch", "the result was made for another model configuration"
            )
        if not result.ok:
            raise SidecarError(result.code or SIDECAR_PROTOCOL, result.message or "no message")
        if result.fingerprint is None:
            raise SidecarError(SIDECAR_PROTOCOL, "the result carries no fingerprint")
        return result

    def _clean_up(self, payload: bytes, result_key: str) -> None:
        """Take a given-up job back from the queue and drop its result key (in the background:
        this runs while the request is being cancelled)."""

        async def clean() -> None:
            try:
                await bounded(self.redis.lrem(self.keys.jobs, 1, payload))
                await bounded(self.redis.delete(result_key))
            except self._errors:
                pass  # the sidecar drops an expired job; a late result expires with its TTL

        task = asyncio.ensure_future(clean())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def aclose(self) -> None:
        if self._cleanups:
            await asyncio.wait(set(self._cleanups), timeout=CONTROL_TIMEOUT_S * 2)
        await self.redis.aclose()

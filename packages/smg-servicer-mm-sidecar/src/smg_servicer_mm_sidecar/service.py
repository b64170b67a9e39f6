"""The sidecar's Redis loops, engine-free: keep ``hello`` alive, pop jobs, push results.

What turns a job into a result is a :class:`JobProcessor` (vLLM's is smg-servicer-vllm's
``smg_servicer_vllm.mm_sidecar.jobs``); this module owns everything the protocol asks of the
sidecar around it:

- ``hello`` rewritten every 5 s with a 15 s TTL (one MULTI), deleted on a clean stop;
- ``concurrency`` loops, each BRPOP on the job list (5 s wait, 2 s outer bound);
- an undecodable job is dropped with a log line; a job past its deadline is dropped
  unprocessed; a job for another fingerprint is answered ``fingerprint_mismatch``;
- an encoded result at or over ``max_result_bytes`` (lowered to Redis's ``proto-max-bulk-len``)
  is replaced by ``result_too_large``; the push (LPUSH + EXPIRE 120 s, one MULTI) has
  max(5 s, time left) and, when Redis refuses it, a small ``result_push_failed`` notice follows;
- a Redis outage is logged once and retried with a bounded back-off; a stop lets every loop
  finish the job it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from smg_servicer_mm_sidecar.client import bounded, transport_errors
from smg_servicer_mm_sidecar.protocol import (
    DEFAULT_MAX_RESULT_BYTES,
    HELLO_INTERVAL_S,
    HELLO_TTL_S,
    JOB_POLL_MARGIN_S,
    JOB_POLL_S,
    RESULT_PUSH_FAILED,
    RESULT_TOO_LARGE,
    RESULT_TTL_S,
    SCHEMA,
    Fingerprint,
    Hello,
    Job,
    JobResult,
    Keys,
    SidecarError,
    decode_job,
    encode,
    failure,
    hello_fields,
    mismatches,
    namespace_for,
)

logger = logging.getLogger(__name__)
PUSH_MIN_BUDGET_S = 5.0
NOTICE_BUDGET_S = 5.0
BACKOFF_S = (0.2, 0.5, 1.0, 2.0)


class JobProcessor(Protocol):
    """Turns a job into a result. Must answer every job (ok or a failure code); only
    cancellation may escape."""

    schemes: tuple[str, ...]

    async def process(self, job: Job) -> JobResult: ...


@dataclass
class Counters:
    processed: int = 0
    failed: int = 0
    expired: int = 0
    undecodable: int = 0
    too_large: int = 0
    push_failed: int = 0


class Sidecar:
    def __init__(
        self,
        redis: Any,
        fingerprint: Fingerprint,
        processor: JobProcessor,
        *,
        namespace: str | None = None,
        concurrency: int = 2,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        settings_source: str = "default",
        poll_s: float = JOB_POLL_S,
        result_ttl_s: int = RESULT_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``poll_s``: how long a loop's BRPOP waits before it looks for a stop (a stop lets the
        wait end, so a job popped at that moment is still processed). ``result_ttl_s``: the
        protocol's 120 s; tests shorten it to watch a key expire."""
        self.redis = redis
        self.fingerprint = fingerprint
        self.processor = processor
        self.keys = Keys(namespace_for(fingerprint, namespace))
        self.concurrency = concurrency
        self.max_result_bytes = self.configured_max_result_bytes = max_result_bytes
        self.settings_source = settings_source
        self.started_at = clock()
        self.clock = clock
        self.poll_s = poll_s
        self.result_ttl_s = result_ttl_s
        #: Set once the first hello is written (the sidecar is discoverable).
        self.announced = asyncio.Event()
        self.counters = Counters()
        self._errors = transport_errors()
        self._outage = False
        self._fitted = False

    # Start and stop ---------------------------------------------------------------------------

    async def fit_to_redis(self) -> None:
        """Lower ``max_result_bytes`` to Redis's ``proto-max-bulk-len`` when that is smaller
        (read again whenever Redis comes back: it may be another server now)."""
        try:
            config = await bounded(self.redis.config_get("proto-max-bulk-len"))
        except self._errors:
            return  # Redis not up yet (or CONFIG renamed away): keep the configured cap
        self._fitted = True
        raw = config.get(b"proto-max-bulk-len", config.get("proto-max-bulk-len"))
        limit = self.configured_max_result_bytes
        if raw is not None and int(raw) < limit:
            logger.info("results capped at Redis's proto-max-bulk-len, %s bytes", int(raw))
            limit = int(raw)
        self.max_result_bytes = limit

    def hello(self) -> Hello:
        return Hello(
            fingerprint=self.fingerprint,
            schema=SCHEMA,
            schemes=self.processor.schemes,
            started_at=self.started_at,
            settings_source=self.settings_source,
            max_result_bytes=self.max_result_bytes,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then let each loop finish its job and remove ``hello``."""
        loops = [asyncio.create_task(self._jobs(stop, i)) for i in range(self.concurrency)]
        hello = asyncio.create_task(self._hello(stop))
        try:
            await stop.wait()
        finally:
            hello.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hello
            with contextlib.suppress(*self._errors):
                await bounded(self.redis.delete(self.keys.hello))
            await asyncio.gather(*loops)

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    def _redis_failed(self, what: str, exc: BaseException) -> None:
        self._fitted = False
        if not self._outage:
            logger.warning("Redis %s failed (%s); retrying", what, type(exc).__name__)
            self._outage = True

    def _redis_ok(self) -> None:
        if self._outage:
            logger.info("Redis is reachable again")
            self._outage = False

    async def _hello(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if not self._fitted:
                    await self.fit_to_redis()
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hset(self.keys.hello, mapping=hello_fields(self.hello()))
                    pipe.expire(self.keys.hello, HELLO_TTL_S)
                    await bounded(pipe.execute())
                if not self.announced.is_set():
                    logger.info("%s written; serving %s", self.keys.hello, self.keys.jobs)
                    self.announced.set()
                self._redis_ok()
                await self._pause(stop, HELLO_INTERVAL_S)
            except self._errors as exc:
                self._redis_failed("hello", exc)
                await self._pause(stop, BACKOFF_S[1])

    # Jobs -------------------------------------------------------------------------------------

    async def _jobs(self, stop: asyncio.Event, index: int) -> None:
        failures = 0
        while not stop.is_set():
            try:
                reply = await asyncio.wait_for(
                    self.redis.brpop([self.keys.jobs], timeout=self.poll_s),
                    self.poll_s + JOB_POLL_MARGIN_S,
                )
                failures = 0
            except self._errors as exc:
                self._redis_failed("job pop", exc)
                await self._pause(stop, BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1
                continue
            if reply is not None:
                await self.handle(reply[1])

    async def handle(self, raw: bytes) -> None:
        """One popped job, answered (or dropped) according to the protocol."""
        try:
            job = decode_job(raw)
        except SidecarError as exc:
            self.counters.undecodable += 1
            logger.warning("dropped an undecodable job (%s)", exc.message)
            return
        now_ms = self.clock() * 1000
        if now_ms >= job.deadline_ms:
            self.counters.expired += 1
            logger.info(
                "dropped job %s of request %s unprocessed: past its deadline by %d ms",
                job.job_id,
                job.request_id,
                now_ms - job.deadline_ms,
            )
            return
        differ = mismatches(self.fingerprint, job.fingerprint)
        if differ:
            result = failure(
                job.job_id,
                "fingerprint_mismatch",
                f"the sidecar serves another configuration ({', '.join(differ)} differ)",
            )
        else:
            try:
                result = await asyncio.wait_for(
                    self.processor.process(job), job.deadline_ms / 1000 - self.clock()
                )
            except TimeoutError:
                self.counters.expired += 1
                logger.info("job %s ran past its deadline; dropped", job.job_id)
                return
            except Exception:
                logger.exception("job %s: the processor failed", job.job_id)
                result = failure(job.job_id, "processor_error", "the media could not be processed")
        self.counters.processed += 1
        self.counters.failed += 0 if result.ok else 1
        await self._push(job, result)

    async def _push(self, job: Job, result: JobResult) -> None:
        payload = encode(result)
        if len(payload) >= self.max_result_bytes:
            self.counters.too_large += 1
            payload = encode(
                failure(
                    job.job_id,
                    RESULT_TOO_LARGE,
                    f"the processed media take {len(payload)} bytes, the sidecar's limit is "
                    f"{self.max_result_bytes}",
                )
            )
        key = self.keys.result(job.job_id)
        budget = max(PUSH_MIN_BUDGET_S, job.deadline_ms / 1000 - self.clock())
        try:
            await self._lpush(key, payload, budget)
            return
        except self._errors as exc:
            self.counters.push_failed += 1
            logger.warning(
                "the result of job %s could not be pushed (%s)", job.job_id, type(exc).__name__
            )
        notice = encode(failure(job.job_id, RESULT_PUSH_FAILED, "Redis refused the result"))
        try:
            await self._lpush(key, notice, NOTICE_BUDGET_S)
        except self._errors as exc:
            logger.warning(
                "job %s: the push-failure notice failed too (%s)", job.job_id, type(exc).__name__
            )

    async def _lpush(self, key: str, payload: bytes, budget_s: float) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, payload)
            pipe.expire(key, self.result_ttl_s)
            await bounded(pipe.execute(), budget_s)

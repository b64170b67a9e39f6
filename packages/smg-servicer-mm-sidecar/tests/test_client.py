"""The worker's client over an in-memory Redis (fakeredis): probe, submit and every failure code."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import fakeredis
import msgspec
import pytest

from smg_servicer_mm_sidecar import protocol as p
from smg_servicer_mm_sidecar.client import SidecarClient

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]

FP = p.Fingerprint("m", "0.32.0", "float32", "opencv", "{}", "{}", "*")
ITEMS = [p.JobItem("image", "data:image/png;base64,AAAA")]


def hello(fingerprint: p.Fingerprint = FP, schema: int = 1) -> dict[str, str]:
    fields = p.hello_fields(p.Hello(fingerprint, schema, ("data", "file"), 1.0, "flag", 1 << 20))
    return fields


@pytest.fixture
def redis() -> Any:
    return fakeredis.FakeAsyncRedis()


def client(redis: Any, **kwargs: Any) -> SidecarClient:
    options: dict[str, int] = {"timeout_ms": 2000, "max_queue": 4} | kwargs
    return SidecarClient(
        redis, FP, timeout_ms=options["timeout_ms"], max_queue=options["max_queue"]
    )


async def answer(redis: Any, keys: p.Keys, make: Any) -> p.Job:
    """Pop one job like a sidecar and push ``make(job)``."""
    _, raw = await redis.brpop([keys.jobs], timeout=5)
    job = p.decode_job(raw)
    await redis.lpush(keys.result(job.job_id), p.encode(make(job)))
    return job


def ok(job: p.Job, fingerprint: p.Fingerprint | None = FP) -> p.JobResult:
    return p.JobResult(
        v=1,
        job_id=job.job_id,
        ok=True,
        fingerprint=fingerprint,
        prompt_token_ids=[1, 7, 7, 2],
        mm_hashes={"image": ["h"]},
        mm_placeholders={"image": [p.Placeholder(1, 2)]},
        mm_kwargs={"image": [b"blob"]},
    )


async def test_no_hello_means_not_advertised(redis) -> None:
    c = client(redis)
    assert await c.probe() is None and not c.advertised
    with pytest.raises(p.SidecarError) as info:
        await c.submit("r", [1, 2], None, ITEMS)
    assert info.value.code == p.SIDECAR_UNAVAILABLE
    assert await redis.llen(c.keys.jobs) == 0


async def test_a_matching_hello_is_adopted_and_a_mismatch_is_not(redis) -> None:
    c = client(redis)
    await redis.hset(c.keys.hello, mapping=hello())
    found = await c.probe(max_age_s=0)
    assert found is not None and found.schemes == ("data", "file")
    await redis.hset(c.keys.hello, mapping=hello(msgspec.structs.replace(FP, dtype="bfloat16")))
    assert await c.probe(max_age_s=0) is None
    await redis.hset(c.keys.hello, mapping=hello(schema=2))
    assert await c.probe(max_age_s=0) is None


async def test_a_redis_error_is_not_advertised_and_submit_is_unavailable() -> None:
    broken = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    broken.connection_pool.connection_kwargs["server"].connected = False
    c = client(broken)
    assert await c.probe() is None
    with pytest.raises(p.SidecarError) as info:
        await c.submit("r", [1], None, ITEMS)
    assert info.value.code == p.SIDECAR_UNAVAILABLE


async def test_a_success_uses_a_new_job_id_per_attempt_with_the_timeout_as_deadline(redis) -> None:
    c = client(redis)
    await redis.hset(c.keys.hello, mapping=hello())
    seen: list[p.Job] = []
    for _ in range(2):
        task = asyncio.create_task(c.submit("req-1", [1, 2], "text", ITEMS))
        seen.append(await answer(redis, c.keys, ok))
        result = await task
        assert result.ok and result.prompt_token_ids == [1, 7, 7, 2]
    assert seen[0].job_id != seen[1].job_id
    for job in seen:
        assert job.request_id == "req-1" and job.prompt == "text" and job.items == ITEMS
        assert job.deadline_ms - job.enqueued_ms == 2000
        assert abs(job.enqueued_ms - time.time() * 1000) < 5000
    assert await redis.keys(c.keys.results_pattern) == []  # the pop removed the result


async def test_a_deep_queue_fails_fast_without_a_push(redis) -> None:
    c = client(redis, max_queue=2, timeout_ms=30_000)
    await redis.hset(c.keys.hello, mapping=hello())
    await redis.lpush(c.keys.jobs, b"a", b"b")
    started = time.monotonic()
    with pytest.raises(p.SidecarError) as info:
        await c.submit("r", [1], None, ITEMS)
    assert info.value.code == p.SIDECAR_OVERLOADED and info.value.status == "UNAVAILABLE"
    assert time.monotonic() - started < 5  # at once (milliseconds), not at the 30 s deadline
    assert await redis.llen(c.keys.jobs) == 2


async def test_no_result_is_a_timeout_and_the_job_is_taken_back(redis) -> None:
    c = client(redis, timeout_ms=300)
    await redis.hset(c.keys.hello, mapping=hello())
    with pytest.raises(p.SidecarError) as info:
        await c.submit("r", [1], None, ITEMS)
    assert info.value.code == p.SIDECAR_TIMEOUT and info.value.status == "INTERNAL"
    await c.aclose()  # waits for the background cleanup
    assert await redis.llen(c.keys.jobs) == 0


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("fetch_failed", "INVALID_ARGUMENT"),
        ("result_too_large", "INVALID_ARGUMENT"),
        ("processor_error", "UNAVAILABLE"),
        ("result_push_failed", "UNAVAILABLE"),
    ],
)
async def test_a_failure_result_raises_its_code(redis, code, status) -> None:
    c = client(redis)
    await redis.hset(c.keys.hello, mapping=hello())
    task = asyncio.create_task(c.submit("r", [1], None, ITEMS))
    await answer(redis, c.keys, lambda job: p.failure(job.job_id, code, "why"))
    with pytest.raises(p.SidecarError) as info:
        await task
    assert (info.value.code, info.value.status) == (code, status)


async def test_a_forged_result_is_rejected(redis) -> None:
    c = client(redis)
    await redis.hset(c.keys.hello, mapping=hello())
    other = msgspec.structs.replace(FP, model="another")
    task = asyncio.create_task(c.submit("r", [1], None, ITEMS))
    await answer(redis, c.keys, lambda job: ok(job, other))
    with pytest.raises(p.SidecarError) as info:
        await task
    assert info.value.code == "fingerprint_mismatch" and info.value.status == "UNAVAILABLE"
    # a result for another job id (or undecodable) is a protocol error
    task = asyncio.create_task(c.submit("r", [1], None, ITEMS))
    await answer(redis, c.keys, lambda job: ok(msgspec.structs.replace(job, job_id="x")))
    with pytest.raises(p.SidecarError) as info:
        await task
    assert info.value.code == p.SIDECAR_PROTOCOL

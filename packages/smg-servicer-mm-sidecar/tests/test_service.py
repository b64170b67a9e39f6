"""The sidecar's Redis loops against a real redis-server, with a stand-in processor (no vLLM): the
worker's client and the loops end to end, deadlines, caps, refusals, outages and cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from smg_servicer_core.testing.redis_server import RedisServer
from smg_servicer_mm_sidecar import protocol as p
from smg_servicer_mm_sidecar.client import SidecarClient, connect
from smg_servicer_mm_sidecar.service import Sidecar

pytestmark = [pytest.mark.contract, pytest.mark.asyncio(loop_scope="module")]

FP = p.Fingerprint("m", "0.32.0", "float32", "opencv", "{}", "{}", "image=2,video=*,audio=*")
ITEMS = [p.JobItem("image", "data:image/png;base64,AAAA")]
#: The client's deadline in these tests, and what "at once" means beside it: far apart, and far
#: above a healthy answer (milliseconds), so a busy machine cannot blur the two.
TIMEOUT_MS = 30_000
AT_ONCE_S = 5.0


class StandIn:
    """Answers each job with ``size`` bytes of tensors; records what it was given."""

    schemes: tuple[str, ...] = ("data", "http", "https")

    def __init__(self) -> None:
        self.jobs: list[p.Job] = []
        self.size = 16
        self.entered = asyncio.Event()
        self.hold: asyncio.Event | None = None

    async def process(self, job: p.Job) -> p.JobResult:
        self.jobs.append(job)
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        return p.JobResult(
            v=1,
            job_id=job.job_id,
            ok=True,
            fingerprint=FP,
            prompt_token_ids=[*job.prompt_token_ids, 9],
            mm_hashes={"image": ["h"]},
            mm_placeholders={"image": [p.Placeholder(0, 1)]},
            mm_kwargs={"image": [b"x" * self.size]},
        )


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="pa55word") as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def stack(redis_server: RedisServer) -> AsyncIterator[tuple[Sidecar, SidecarClient, Any]]:
    redis_server.start()
    control = connect(redis_server.url)
    await control.flushall()
    processor = StandIn()
    sidecar = Sidecar(connect(redis_server.url), FP, processor, concurrency=2, poll_s=0.2)
    client = SidecarClient(connect(redis_server.url), FP, timeout_ms=TIMEOUT_MS, max_queue=8)
    stop = asyncio.Event()
    running = asyncio.create_task(sidecar.run(stop))
    await asyncio.wait_for(sidecar.announced.wait(), 5)
    try:
        yield sidecar, client, control
    finally:
        stop.set()
        await asyncio.wait_for(running, 15)
        await client.aclose()
        await control.aclose()


async def submit(client: SidecarClient, request_id: str = "r") -> p.JobResult:
    return await client.submit(request_id, [5, 6], None, ITEMS)


async def test_a_job_round_trips_and_leaves_no_result_key(stack) -> None:
    _, client, control = stack
    results = await asyncio.gather(*(submit(client, f"r{i}") for i in range(6)))
    assert [r.prompt_token_ids for r in results] == [[5, 6, 9]] * 6
    assert await control.keys(client.keys.results_pattern) == []
    assert await control.llen(client.keys.jobs) == 0


async def test_hello_lives_15_s_and_goes_on_a_clean_stop(redis_server) -> None:
    control = connect(redis_server.url)
    sidecar = Sidecar(connect(redis_server.url), FP, StandIn(), poll_s=0.2)
    stop = asyncio.Event()
    running = asyncio.create_task(sidecar.run(stop))
    await asyncio.wait_for(sidecar.announced.wait(), 5)
    ttl = await control.ttl(sidecar.keys.hello)
    assert 0 < ttl <= p.HELLO_TTL_S
    hello = p.parse_hello(await control.hgetall(sidecar.keys.hello))
    assert hello is not None and hello.fingerprint == FP and hello.schemes == StandIn.schemes
    stop.set()
    await asyncio.wait_for(running, 15)
    assert not await control.exists(sidecar.keys.hello)
    await control.aclose()


async def test_a_job_past_its_deadline_is_dropped_unprocessed(stack) -> None:
    sidecar, client, control = stack
    now = int(time.time() * 1000)
    late = p.Job(1, "late", "r", FP, [1], None, ITEMS, now - 5000, now - 1)
    await control.lpush(client.keys.jobs, p.encode(late))
    await submit(client)  # behind it in the queue: the late one was popped first
    assert [j.job_id for j in sidecar.processor.jobs if j.job_id == "late"] == []
    assert sidecar.counters.expired == 1
    assert not await control.exists(client.keys.result("late"))


async def test_an_undecodable_job_is_dropped_and_the_loop_goes_on(stack) -> None:
    sidecar, client, control = stack
    await control.lpush(client.keys.jobs, b"\xc1 not msgpack")
    await submit(client)
    assert sidecar.counters.undecodable == 1


async def test_a_job_for_another_fingerprint_is_answered_mismatch(stack) -> None:
    sidecar, client, control = stack
    other = p.Fingerprint(*(f"{v}x" for v in FP.fields().values()))
    now = int(time.time() * 1000)
    job = p.Job(1, "other", "r", other, [1], None, ITEMS, now, now + 3000)
    await control.lpush(client.keys.jobs, p.encode(job))
    _, raw = await control.brpop([client.keys.result("other")], timeout=5)
    result = p.decode_result(raw)
    assert (result.ok, result.code) == (False, "fingerprint_mismatch")
    assert sidecar.processor.jobs == []


async def test_a_result_over_the_cap_is_media_too_large(stack) -> None:
    sidecar, client, _ = stack
    sidecar.max_result_bytes = 4096
    sidecar.processor.size = 8192
    with pytest.raises(p.SidecarError) as info:
        await submit(client)
    assert info.value.code == p.RESULT_TOO_LARGE and info.value.status == "INVALID_ARGUMENT"
    assert p.client_message(info.value.code, info.value.message).startswith("media_too_large")
    assert sidecar.counters.too_large == 1


async def test_the_cap_follows_redis_proto_max_bulk_len(stack) -> None:
    sidecar, _, control = stack
    await control.config_set("proto-max-bulk-len", str(2 << 20))
    try:
        await sidecar.fit_to_redis()
        assert sidecar.max_result_bytes == 2 << 20
    finally:
        await control.config_set("proto-max-bulk-len", str(512 << 20))
    await sidecar.fit_to_redis()  # a Redis that takes more gives the configured cap back
    assert sidecar.max_result_bytes == sidecar.configured_max_result_bytes


async def test_a_result_redis_refuses_is_reported_at_once(stack) -> None:
    sidecar, client, control = stack
    sidecar.processor.size = 3 << 20  # under the sidecar's cap, over what Redis now takes
    await control.config_set("proto-max-bulk-len", str(1 << 20))
    try:
        started = time.monotonic()
        with pytest.raises(p.SidecarError) as info:
            await submit(client)
        assert info.value.code == p.RESULT_PUSH_FAILED and info.value.status == "UNAVAILABLE"
        assert time.monotonic() - started < AT_ONCE_S  # not the deadline
        assert sidecar.counters.push_failed == 1
    finally:
        await control.config_set("proto-max-bulk-len", str(512 << 20))


async def test_a_stuck_sidecar_times_out_and_the_given_up_job_leaves_nothing(stack) -> None:
    sidecar, client, control = stack
    sidecar.processor.hold = asyncio.Event()
    client.timeout_ms = 500
    with pytest.raises(p.SidecarError) as info:
        await submit(client)
    assert info.value.code == p.SIDECAR_TIMEOUT and info.value.status == "INTERNAL"
    assert await control.llen(client.keys.jobs) == 0
    sidecar.processor.hold.set()
    keys = await control.keys(client.keys.results_pattern)
    for key in keys:  # anything pushed after the give-up expires with the result TTL
        assert 0 < await control.ttl(key) <= p.RESULT_TTL_S


async def test_redis_down_is_unavailable_at_once_and_both_sides_recover(
    stack, redis_server
) -> None:
    _, client, _ = stack
    redis_server.kill()
    started = time.monotonic()
    with pytest.raises(p.SidecarError) as info:
        await client.submit("r", [1], None, ITEMS)
    assert info.value.code == p.SIDECAR_UNAVAILABLE
    assert time.monotonic() - started < AT_ONCE_S
    assert await client.probe(max_age_s=0) is None
    redis_server.start()  # empty: the sidecar must write hello again, the loops pop again
    deadline = time.monotonic() + 15
    while await client.probe(max_age_s=0) is None:
        assert time.monotonic() < deadline, "the sidecar did not come back"
        await asyncio.sleep(0.1)
    result = await client.submit("after", [1], None, ITEMS)
    assert result.ok


async def test_redis_killed_mid_job_fails_the_job_at_once(stack, redis_server) -> None:
    sidecar, client, _ = stack
    sidecar.processor.hold = asyncio.Event()
    task = asyncio.create_task(client.submit("r", [1], None, ITEMS))
    await sidecar.processor.entered.wait()
    started = time.monotonic()
    redis_server.kill()
    with pytest.raises(p.SidecarError) as info:
        await task
    assert info.value.code == p.SIDECAR_UNAVAILABLE
    assert time.monotonic() - started < AT_ONCE_S
    sidecar.processor.hold.set()  # its push fails; the notice too; nothing is left hanging
    redis_server.start()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.probe(max_age_s=0), 2)


async def test_a_cancelled_wait_takes_the_job_back(stack) -> None:
    sidecar, client, control = stack
    sidecar.processor.hold = asyncio.Event()  # the two loops hold a job each ...
    tasks = [asyncio.create_task(client.submit(f"r{i}", [1], None, ITEMS)) for i in range(3)]
    # The state is in Redis (one job queued behind the two held): nothing to wait on but a read.
    while await control.llen(client.keys.jobs) < 1 or len(sidecar.processor.jobs) < 2:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    for task in tasks:
        task.cancel()
    started = time.monotonic()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert time.monotonic() - started < AT_ONCE_S
    sidecar.processor.hold.set()
    await client.aclose()  # waits for the background cleanup
    assert await control.llen(client.keys.jobs) == 0


async def test_a_late_result_expires_with_its_ttl(redis_server) -> None:
    """A job given up by the worker, answered after: its key carries the TTL and is gone after
    it (the protocol's 120 s, shortened here to 1 s)."""
    control = connect(redis_server.url)
    await control.flushall()  # earlier tests' late results live for the protocol's 120 s
    processor = StandIn()
    processor.hold = asyncio.Event()
    sidecar = Sidecar(connect(redis_server.url), FP, processor, poll_s=0.2, result_ttl_s=1)
    client = SidecarClient(connect(redis_server.url), FP, timeout_ms=3000)
    stop = asyncio.Event()
    running = asyncio.create_task(sidecar.run(stop))
    await asyncio.wait_for(sidecar.announced.wait(), 5)
    task = asyncio.create_task(client.submit("late", [1], None, ITEMS))
    await processor.entered.wait()
    task.cancel()  # the worker gives up: its cleanup deletes a key that does not exist yet
    await asyncio.gather(task, return_exceptions=True)
    await client.aclose()
    processor.hold.set()  # the sidecar answers now
    key = sidecar.keys.result(processor.jobs[0].job_id)
    while not await control.exists(key):  # noqa: ASYNC110 - the state is in Redis
        await asyncio.sleep(0.02)
    assert 0 < await control.pttl(key) <= 1000
    while await control.exists(key):  # noqa: ASYNC110 - Redis expires it
        await asyncio.sleep(0.05)
    assert await control.keys(sidecar.keys.results_pattern) == []
    stop.set()
    await asyncio.wait_for(running, 15)
    await control.aclose()

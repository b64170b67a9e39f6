from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from smg_servicer_core import registry as registry_module
from smg_servicer_core.errors import Aborted, AlreadyExists, InvalidRequest
from smg_servicer_core.registry import RequestRegistry


class CountingEngine:
    def __init__(self) -> None:
        self.aborts: Counter[str] = Counter()

    async def abort(self, request_id: str) -> None:
        await asyncio.sleep(0)
        self.aborts[request_id] += 1


@pytest.mark.unit
async def test_thousand_concurrent_start_abort_pairs() -> None:
    engine = CountingEngine()
    registry = RequestRegistry(engine.abort)
    started = {f"r{i}": asyncio.Event() for i in range(1000)}

    async def request(rid: str) -> None:
        async with registry.track(rid) as handle:
            started[rid].set()
            await handle.stopped.wait()

    async def aborter(rid: str) -> None:
        await started[rid].wait()
        # Two Abort RPCs for the same id (the router may send more than one): one engine abort.
        await asyncio.gather(registry.abort(rid), registry.abort(rid))

    await asyncio.wait_for(
        asyncio.gather(*(request(r) for r in started), *(aborter(r) for r in started)), 30
    )
    assert len(registry) == 0
    assert set(engine.aborts) == set(started)
    assert set(engine.aborts.values()) == {1}


@pytest.mark.unit
async def test_cancel_then_abort_rpc_aborts_once() -> None:
    engine = CountingEngine()
    registry = RequestRegistry(engine.abort)
    entered = asyncio.Event()

    async def request() -> None:
        async with registry.track("r") as _:
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(request())
    await entered.wait()
    assert len(registry) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await registry.abort("r") is False  # already gone: a no-op
    assert engine.aborts == Counter({"r": 1})
    assert len(registry) == 0


@pytest.mark.unit
async def test_normal_finish_is_never_aborted() -> None:
    engine = CountingEngine()
    registry = RequestRegistry(engine.abort)
    async with registry.track("r"):
        pass
    assert await registry.abort("r") is False
    assert not engine.aborts


@pytest.mark.unit
async def test_unknown_id_is_a_no_op_and_duplicates_are_refused() -> None:
    engine = CountingEngine()
    registry = RequestRegistry(engine.abort)
    assert await registry.abort("nope") is False
    async with registry.track("r"):
        with pytest.raises(AlreadyExists):
            async with registry.track("r"):
                pass
    with pytest.raises(InvalidRequest):
        async with registry.track(""):
            pass
    assert not engine.aborts


@pytest.mark.unit
async def test_error_inside_aborts_the_engine_request() -> None:
    engine = CountingEngine()
    registry = RequestRegistry(engine.abort)
    with pytest.raises(ValueError, match="x"):
        async with registry.track("r"):
            raise ValueError("x")
    assert engine.aborts == Counter({"r": 1})


@pytest.mark.unit
async def test_an_abort_that_overtakes_its_generate_refuses_it_on_arrival() -> None:
    engine = CountingEngine()
    registry = RequestRegistry(engine.abort)
    assert not await registry.abort("early")
    with pytest.raises(Aborted, match="request early was aborted before it arrived"):
        async with registry.track("early"):
            pass
    assert not engine.aborts, "nothing reached the engine, so nothing is aborted there"
    async with registry.track("early"):  # remembered once: the id may be used again
        pass
    assert len(registry) == 0


@pytest.mark.unit
async def test_early_aborts_are_forgotten_after_their_time_and_past_the_bound(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(registry_module, "clock", lambda: now[0])
    registry = RequestRegistry(CountingEngine().abort)
    await registry.abort("old")
    now[0] += registry_module.EARLY_ABORT_MEMORY_S + 0.1
    async with registry.track("old"):  # its abort expired
        pass
    for i in range(registry_module.EARLY_ABORT_MEMORY + 5):
        await registry.abort(f"x{i}")
    assert len(registry._early) == registry_module.EARLY_ABORT_MEMORY
    async with registry.track("x0"):  # the oldest were forgotten first
        pass
    with pytest.raises(Aborted):
        async with registry.track(f"x{registry_module.EARLY_ABORT_MEMORY + 4}"):
            pass


@pytest.mark.unit
async def test_a_request_id_past_the_bound_is_refused_before_anything_else() -> None:
    registry = RequestRegistry(CountingEngine().abort)
    bound = registry_module.MAX_REQUEST_ID_CHARS
    async with registry.track("x" * bound):
        pass
    with pytest.raises(InvalidRequest, match=f"request_id has {bound + 1} characters; at most"):
        async with registry.track("x" * (bound + 1)):
            pass
    assert len(registry) == 0

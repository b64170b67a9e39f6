"""GetServerInfo's pause probe when TokenSpeed's scheduler cannot say (a fake front end at the
engine boundary): UNAVAILABLE, never read as "not paused"; the pause itself on the real front end
is test_engine.py's."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.asyncio(loop_scope="session")


class _Silent:
    """A front end whose scheduler never answers the pause probe (a hung scheduler), or fails it."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked = 0

    async def is_scheduler_paused(self) -> bool:
        self.asked += 1
        if self.fail:
            raise RuntimeError("the scheduler's socket is closed")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.unit
@pytest.mark.parametrize("fail", [False, True], ids=["hangs", "fails"])
async def test_a_pause_state_the_scheduler_does_not_give_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    """Not "serving": a probe that times out or fails makes GetServerInfo UNAVAILABLE, and a
    pending probe is reused by the next call instead of piling up another."""
    from smg_servicer_core.errors import Unavailable
    from smg_servicer_tokenspeed.servicer import TokenSpeedServicer

    monkeypatch.setenv("TOKENSPEED_PAUSE_PROBE_TIMEOUT", "0.05")
    servicer = object.__new__(TokenSpeedServicer)  # only what the probe reads
    servicer.encode_role = False
    servicer._pause_probe = None
    servicer.llm = llm = _Silent(fail)
    messages = []
    for _ in range(2):
        with pytest.raises(Unavailable) as refused:
            await servicer._is_paused()
        messages.append(str(refused.value))
    expected_asks = 2 if fail else 1
    assert llm.asked == expected_asks
    assert messages == 2 * [
        "the scheduler could not say whether it is paused"
        if fail
        else "the scheduler did not say within 0.05 s whether it is paused"
    ]
    if servicer._pause_probe is not None:
        servicer._pause_probe.cancel()

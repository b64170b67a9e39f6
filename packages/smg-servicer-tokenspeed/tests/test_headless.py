"""The TokenSpeed headless launcher's engine-free parts: its flags, the input check and the drain
count each rank keeps (the lane itself: tests/engine/test_zmq_lane.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_tokenspeed.headless import RankGuard, parse

pytestmark = pytest.mark.unit


def test_the_worker_url_names_the_routers_handshake_and_the_rest_is_tokenspeeds() -> None:
    ours, rest = parse(["--zmq-worker-url", "ipc:///run/smg/e0", "--model", "m", "--port", "9"])
    assert ours.zmq_handshake_address == f"tcp://127.0.0.1:{handshake_port('ipc:///run/smg/e0')}"
    assert rest == ["--model", "m", "--port", "9"]


def test_without_our_flags_tokenspeeds_own_endpoint_is_used() -> None:
    ours, rest = parse(["--data-parallel-rpc-port", "20001", "--zmq-engine-index", "0"])
    assert ours.zmq_handshake_address is None
    assert rest == ["--data-parallel-rpc-port", "20001", "--zmq-engine-index", "0"]


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--zmq-worker-url", "tcp://h:1"], "must be ipc://PATH"),
        (["--zmq-handshake-address", "ipc:///x"], "must be tcp://HOST:PORT"),
        (["--zmq-worker-url", "ipc:///x", "--zmq-drain-timeout", "-1"], ">= 0"),
    ],
)
def test_bad_flags_are_configuration_errors(argv: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse(argv)


def batch(*rows: tuple[str, object]) -> SimpleNamespace:
    return SimpleNamespace(rids=[r for r, _ in rows], finished_reasons=[f for _, f in rows])


def test_the_drain_stops_the_rank_once_the_last_request_finishes() -> None:
    kills: list[int] = []
    guard = RankGuard(lambda: kills.append(1))
    guard.in_flight.update({"a", "b"})
    guard.on_drain(0, None)
    guard.sent(batch(("a", {"type": "length"}), ("b", None)))
    assert kills == []  # b is still running
    guard.sent(batch(("b", {"type": "stop"})))
    assert kills == [1]
    guard.sent(batch())
    assert kills == [1]  # once


def test_a_drain_with_nothing_in_flight_stops_at_once_and_outputs_alone_never_do() -> None:
    kills: list[int] = []
    guard = RankGuard(lambda: kills.append(1))
    guard.sent(batch(("x", {"type": "length"})))
    assert kills == []
    guard.on_drain(0, None)
    assert kills == [1]

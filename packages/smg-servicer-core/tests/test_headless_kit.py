"""Core's headless kit (smg_servicer_core.headless), the supervisor every headless launcher
(SGLang's, TokenSpeed's) runs its ranks under, against stand-in ranks (real processes,
smg_servicer_core.testing.ranks) and a relay that records what it told the router: the drain, a
rank's death, a failure signal, a signal while the ranks start, a start error, and the lane's
flags. The launchers under the real router: tests-integration/test_sglang_zmq_lane.py and the
TokenSpeed ZMQ lane tests."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from smg_servicer_core import headless, watchdog
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.headless import Adapter, Ranks, Supervisor
from smg_servicer_core.testing.ranks import rank

pytestmark = pytest.mark.unit

DRAIN = signal.SIGUSR2
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, DRAIN)
#: Far above any verdict below: a run that takes this long did not see what happened.
LONG_S = 30.0


class Relay:
    """What the supervisor tells the router: each ``send_dead`` (the dead-engine sentinel)."""

    def __init__(self, outputs: list[str] | None = None) -> None:
        self._outputs = ["ipc:///router-out"] if outputs is None else outputs
        self.told = 0

    def outputs(self) -> list[str]:
        return list(self._outputs)

    def send_dead(self) -> list[str]:
        self.told += 1
        return self.outputs()


@pytest.fixture(autouse=True)
def _events_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor wakes on the ranks' exits and on signals, never on the watch's ceiling (a
    backstop): a run that needs it does not end before the guard of :func:`timed_run`."""
    monkeypatch.setattr(watchdog, "EXIT_WATCH_CEILING_S", LONG_S * 2)


@pytest.fixture(autouse=True)
def _handlers() -> Iterator[None]:
    """The supervisor installs its signal handlers in this (the test's) process: put them back."""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def start_ranks(*on_drain: str) -> list[Any]:
    """Stand-in ranks, each doing ``on_drain`` when told to drain, started and ready."""
    ctx = multiprocessing.get_context("fork")  # the rank resets what it inherits
    started = []
    for what in on_drain:
        ready = ctx.Event()
        process = ctx.Process(target=rank, args=(what, DRAIN, ready), daemon=True)
        process.start()
        started.append((process, ready))
    for process, ready in started:
        assert ready.wait(LONG_S), f"stand-in rank {process.pid} never became ready"
    return [process for process, _ in started]


def supervisor(ranks: Ranks, relay: Relay, drain_s: float = LONG_S) -> Supervisor:
    return Supervisor(
        ranks, relay, drain_s=drain_s, drain_signal=DRAIN, failure_signals=(signal.SIGQUIT,),
        stop_s=2.0,
    )  # fmt: skip


def timed_run(watched: Supervisor) -> tuple[int, float]:
    """``watched.run()`` with its signal handlers installed, and how long it took; one that has
    not ended after :data:`LONG_S` is ended by a failure signal (then fails here: it missed what
    happened)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, watched.on_signal)
    guard = threading.Timer(LONG_S, lambda: os.kill(os.getpid(), signal.SIGQUIT))
    guard.start()
    start = time.monotonic()
    try:
        code = watched.run()
    finally:
        guard.cancel()
    took = time.monotonic() - start
    assert took < LONG_S / 2, "the supervisor did not see what happened"
    return code, took


def later(seconds: float, action: Any) -> None:
    threading.Timer(seconds, action).start()


def test_a_drain_ends_once_every_rank_finished_and_only_close_tells_the_router() -> None:
    processes = start_ranks("finish", "finish")
    relay = Relay()
    watched = supervisor(Ranks(processes), relay)
    try:
        later(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert timed_run(watched)[0] == ExitCode.OK
        assert [p.exitcode for p in processes] == [0, 0]  # each drained itself
        assert relay.told == 0  # a drained worker is not a dead one
    finally:
        watched.close()
    assert relay.told == 1  # close: the router stops routing here


def test_a_rank_killed_while_serving_is_a_death_told_at_once() -> None:
    processes = start_ranks("finish", "finish")
    relay = Relay()
    watched = supervisor(Ranks(processes), relay)
    try:
        later(0.2, lambda: os.kill(processes[1].pid, signal.SIGKILL))
        assert timed_run(watched)[0] == ExitCode.ENGINE_DIED
        assert relay.told == 1
        assert processes[0].is_alive()  # the others are stopped by close, not left
    finally:
        watched.close()
    assert not any(p.is_alive() for p in processes)


def test_a_rank_that_exits_cleanly_unasked_is_a_death_too() -> None:
    processes = start_ranks("finish")
    relay = Relay()
    watched = supervisor(Ranks(processes), relay)
    try:
        later(0.2, lambda: os.kill(processes[0].pid, DRAIN))  # exits 0, but no drain was asked
        assert timed_run(watched)[0] == ExitCode.ENGINE_DIED
        assert relay.told == 1
    finally:
        watched.close()


def test_a_rank_that_fails_while_draining_is_a_death() -> None:
    processes = start_ranks("finish", "fail")
    relay = Relay()
    watched = supervisor(Ranks(processes), relay)
    try:
        later(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
        assert timed_run(watched)[0] == ExitCode.ENGINE_DIED
        assert relay.told == 1
    finally:
        watched.close()


def test_a_drain_that_runs_out_of_time_fails_what_is_left() -> None:
    processes = start_ranks("finish", "hang")
    relay = Relay()
    watched = supervisor(Ranks(processes), relay, drain_s=0.5)
    try:
        later(0.1, lambda: os.kill(os.getpid(), signal.SIGTERM))
        code, took = timed_run(watched)
        assert code == ExitCode.ENGINE_DIED
        assert took >= 0.5
        assert processes[1].is_alive()
    finally:
        watched.close()
    assert not processes[1].is_alive()  # close ends the rank that would not drain


def test_a_failure_signal_is_a_death_even_with_every_rank_alive() -> None:
    processes = start_ranks("finish")
    relay = Relay()
    watched = supervisor(Ranks(processes), relay)
    try:
        watched.on_signal(signal.SIGQUIT, None)
        assert watched.verdict(draining=False) == (
            ExitCode.ENGINE_DIED,
            "a scheduler rank reported a fatal error (SIGQUIT)",
        )
        assert timed_run(watched)[0] == ExitCode.ENGINE_DIED
        assert relay.told == 1
    finally:
        watched.close()


def test_a_rank_known_only_by_pid_is_watched_and_signalled(tmp_path: Any) -> None:
    """A DP controller's ranks are the launcher's grandchildren: watched by pid, their exit code
    unknown; while draining, such an exit counts as finished."""
    processes = start_ranks("finish", "finish")
    relay = Relay()
    # The second rank as a grandchild would be: known by its pid only.
    watched = supervisor(Ranks(processes[:1], others=[processes[1].pid]), relay)
    try:
        later(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert timed_run(watched)[0] == ExitCode.OK
        processes[1].join(5)
        assert processes[1].exitcode == 0  # it got the drain signal too
    finally:
        watched.close()


class StartFailed(Exception):
    pass


def test_a_stop_while_the_ranks_start_stops_the_launch_and_leaves_none_running() -> None:
    started: list[Any] = []

    def start() -> Ranks:
        started.extend(start_ranks("finish"))
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher is stopped mid-start
        time.sleep(LONG_S)
        raise AssertionError("the stop did not interrupt the start")

    relay = Relay()
    assert headless.supervise(relay, Adapter(start, drain_signal=DRAIN), 5.0) == ExitCode.OK
    assert not started[0].is_alive()


def test_a_stop_wrapped_by_the_engines_start_code_is_still_a_stop() -> None:
    """SGLang's start-up code catches what interrupts it and raises its own error from it."""

    def start() -> Ranks:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(LONG_S)
        except BaseException as err:
            raise StartFailed("interrupted") from err
        raise AssertionError("the stop did not interrupt the start")

    adapter = Adapter(start, drain_signal=DRAIN, start_errors=(StartFailed,))
    assert headless.supervise(Relay(), adapter, 5.0) == ExitCode.OK


@pytest.mark.parametrize("how", ["failure signal", "start error"])
def test_a_rank_failing_while_the_ranks_start_is_a_death(how: str) -> None:
    started: list[Any] = []

    def start() -> Ranks:
        started.extend(start_ranks("finish"))
        if how == "start error":
            raise StartFailed("rank 0 failed during start-up")
        os.kill(os.getpid(), signal.SIGQUIT)
        time.sleep(LONG_S)
        raise AssertionError("the failure did not interrupt the start")

    adapter = Adapter(start, drain_signal=DRAIN, start_errors=(StartFailed,))
    assert headless.supervise(Relay(), adapter, 5.0) == ExitCode.ENGINE_DIED
    assert not started[0].is_alive()


def test_started_ranks_that_never_dialed_are_a_death_and_are_stopped() -> None:
    started: list[Any] = []

    def start() -> Ranks:
        started.extend(start_ranks("finish"))
        return Ranks(started)

    relay = Relay(outputs=[])
    adapter = Adapter(start, drain_signal=DRAIN, not_dialed="the plugin did not load")
    assert headless.supervise(relay, adapter, 5.0) == ExitCode.ENGINE_DIED
    assert not started[0].is_alive()


def test_supervise_drains_on_sigterm_and_ends_the_ranks_with_the_adapters_stop() -> None:
    stopped: list[float] = []
    closed: list[bool] = []
    started: list[Any] = []

    def start() -> Ranks:
        started.extend(start_ranks("finish", "finish"))
        return Ranks(started, stop=stopped.append, closers=[lambda: closed.append(True)])

    class Stopped(Relay):
        def outputs(self) -> list[str]:  # asked once the ranks serve: the launcher is stopped
            os.kill(os.getpid(), signal.SIGTERM)
            return super().outputs()

    relay = Stopped()
    adapter = Adapter(start, drain_signal=DRAIN, not_dialed="never dialed")
    # The drain's deadline is not what is tested: a loaded machine (a gate's first minutes) once
    # took over 5 s to fork and drain the two stand-in ranks.
    assert headless.supervise(relay, adapter, LONG_S) == ExitCode.OK
    assert [p.exitcode for p in started] == [0, 0]
    assert (stopped, closed, relay.told) == ([headless.STOP_S], [True], 1)


# -- the lane's flags ----------------------------------------------------------------------------


def parsed(argv: list[str], **kw: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    headless.add_lane_flags(parser, fallback="test", engine_index=True)
    ours = parser.parse_args(argv)
    headless.check_lane_flags(ours, **kw)
    return ours


def test_the_handshake_comes_from_a_flag_or_the_fallback() -> None:
    assert parsed(["--zmq-handshake-address", "tcp://h:1"]).zmq_handshake_address == "tcp://h:1"
    url = parsed(["--zmq-worker-url", "ipc:///run/smg/a"]).zmq_handshake_address
    assert url.startswith("tcp://127.0.0.1:")
    assert parsed([], fallback="tcp://f:2").zmq_handshake_address == "tcp://f:2"
    assert parsed([], required=False).zmq_handshake_address is None
    assert parsed([], required=False).zmq_drain_timeout == headless.DRAIN_S


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        ([], "name the router's handshake"),
        (["--zmq-worker-url", "tcp://h:1"], "ipc://PATH"),
        (["--zmq-handshake-address", "h:1"], "tcp://HOST:PORT"),
        (["--zmq-handshake-address", "tcp://h:1", "--zmq-engine-index", "70000"], "0..65535"),
        (["--zmq-handshake-address", "tcp://h:1", "--zmq-drain-timeout", "-1"], ">= 0"),
    ],
)
def test_a_bad_lane_flag_is_a_configuration_error(argv: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parsed(argv)

"""ExitWatch: a launcher's main thread sleeps until a process it watches exits or a signal arrives,
not on a polling timer (the headless launchers' supervisors)."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import threading
import time

import pytest

from smg_servicer_core import watchdog
from smg_servicer_core.watchdog import ExitWatch

pytestmark = pytest.mark.unit

#: Far above any wake-up below: a wait that lasts this long did not wake.
LONG_S = 60.0


@pytest.fixture
def no_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the events end a wait (the ceiling is there for checks the events might miss)."""
    monkeypatch.setattr(watchdog, "EXIT_WATCH_CEILING_S", LONG_S)


def _timed_wait(watch: ExitWatch, timeout_s: float = LONG_S) -> float:
    start = time.monotonic()
    watch.wait(timeout_s)
    return time.monotonic() - start


def test_a_child_that_exits_wakes_the_wait_once(no_ceiling: None) -> None:
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0.5,))
    child.start()
    watch = ExitWatch([child])
    try:
        assert _timed_wait(watch) < LONG_S / 2
        assert child.exitcode == 0  # reaped by the wait: the caller reads how it ended
        # Once told, the exited child no longer ends a wait: no busy loop while others run.
        assert _timed_wait(watch, 0.3) >= 0.25
    finally:
        watch.close()


def test_a_process_known_by_pid_wakes_the_wait(no_ceiling: None) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    watch = ExitWatch(pids=[other.pid])
    try:
        assert not watch.polled  # Linux: a pidfd, no polling
        assert _timed_wait(watch) < LONG_S / 2
        assert other.wait(5) == 0
    finally:
        watch.close()


def test_a_pid_already_gone_is_left_to_the_callers_check(no_ceiling: None) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    watch = ExitWatch(pids=[gone.pid])
    try:
        assert not watch.polled
        assert _timed_wait(watch, 0.2) >= 0.15  # nothing to wait for: the timeout
    finally:
        watch.close()


def test_a_signal_from_another_thread_wakes_the_wait_and_its_handler_ran(
    no_ceiling: None,
) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    watch = ExitWatch()
    timer = threading.Timer(0.3, signal.raise_signal, (signal.SIGUSR1,))
    try:
        timer.start()
        assert _timed_wait(watch) < LONG_S / 2
        assert seen == [signal.SIGUSR1]
    finally:
        timer.cancel()
        watch.close()
        signal.signal(signal.SIGUSR1, previous)


def test_close_gives_back_the_previous_wakeup_fd() -> None:
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    watch = ExitWatch()
    assert signal.set_wakeup_fd(-1) != before  # the watch's own, while open
    signal.set_wakeup_fd(watch._write)
    watch.close()
    assert signal.set_wakeup_fd(before) == before


def test_the_ceiling_bounds_every_wait() -> None:
    watch = ExitWatch()
    try:
        assert _timed_wait(watch) < watchdog.EXIT_WATCH_CEILING_S + 5
    finally:
        watch.close()


def test_outside_the_main_thread_it_polls_and_leaves_the_wakeup_fd_alone(no_ceiling: None) -> None:
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    made: list[ExitWatch] = []
    maker = threading.Thread(target=lambda: made.append(ExitWatch()))
    maker.start()
    maker.join(10)
    (watch,) = made
    try:
        assert watch.polled
        assert _timed_wait(watch) < LONG_S / 2  # its poll, not the 60 s asked
    finally:
        watch.close()
    assert signal.set_wakeup_fd(before) == before


def test_until_sleeps_to_the_deadline_then_says_it_has_passed(no_ceiling: None) -> None:
    watch = ExitWatch()
    try:
        deadline = time.monotonic() + 0.3
        start = time.monotonic()
        assert watch.until(deadline)
        assert 0.25 <= time.monotonic() - start < LONG_S / 2
        assert not watch.until(time.monotonic() - 1)  # passed: no sleep
    finally:
        watch.close()

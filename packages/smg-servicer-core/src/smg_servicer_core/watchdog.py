"""An engine-free process watchdog: ``serve()``'s ``wait_dead`` for engines that run in child
processes (SGLang's schedulers, TokenSpeed's scheduler).

A :class:`Watchdog` holds liveness checks, each a callable returning None while all is well or a
short reason once something died (a child process exited, a child signalled failure, the engine's
socket became unreadable). :meth:`Watchdog.wait_dead` polls them every ``interval_s`` (0.1 s;
each check is a non-blocking ``waitpid`` or a flag) and returns the first reason, so ``serve()``
stops the server and exits 1, and every stream in flight ends UNAVAILABLE, within a few tenths of
a second of a death (the reliability suite's bound is 1 s; at the former 1 s interval SGLang took
0.84 s). See :mod:`smg_servicer_core.entry` for the exit codes. :func:`child_exited` builds the
check for a ``multiprocessing`` process or a ``subprocess.Popen``.

:class:`ExitWatch` is the blocking counterpart for a launcher's main thread (the headless
launchers' supervisors): it sleeps until a watched process exits, a signal arrives or a timeout
passes, instead of waking every few tens of milliseconds to look (an idle supervisor polling at
20 Hz cost SGLang's Rust-lane launcher 5.5 ms of CPU a second, more than the Rust server idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Check = Callable[[], str | None]

WATCH_INTERVAL_S = 0.1


def child_exited(name: str, process: Any) -> Check:
    """A check for one child: ``multiprocessing`` (``exitcode``) or ``subprocess`` (``poll()``)."""

    def check() -> str | None:
        code = process.poll() if hasattr(process, "poll") else process.exitcode
        return None if code is None else f"{name} exited with code {code}"

    return check


class Watchdog:
    def __init__(self, checks: Sequence[Check] = (), interval_s: float = WATCH_INTERVAL_S) -> None:
        self.checks = list(checks)
        self.interval_s = interval_s
        #: Called on every poll with no death found (for periodic work such as stall logging).
        self.on_tick: Callable[[], None] | None = None

    def add(self, check: Check) -> None:
        self.checks.append(check)

    def dead_reason(self) -> str | None:
        """The first reason a check reports, or None while everything is alive."""
        for check in self.checks:
            reason = check()
            if reason is not None:
                return reason
        return None

    async def wait_dead(self) -> str:
        while True:
            reason = self.dead_reason()
            if reason is not None:
                return reason
            if self.on_tick is not None:
                self.on_tick()
            await asyncio.sleep(self.interval_s)


#: The longest an :class:`ExitWatch` sleeps when nothing happens (a check the events might miss).
EXIT_WATCH_CEILING_S = 1.0
#: The most a wait spends reaping a process whose sentinel said it ended (it is exiting).
EXIT_WATCH_REAP_S = 1.0
#: Its sleep when a process cannot be watched by file descriptor (no ``pidfd_open``): polling.
EXIT_WATCH_POLL_S = 0.05


class ExitWatch:
    """Wakes the main thread when a watched process exits or any signal with a Python handler
    arrives; :meth:`wait` returns then or after its timeout (at most
    :data:`EXIT_WATCH_CEILING_S`), and the caller looks at what changed.

    Processes are watched through their ``multiprocessing`` sentinels and, for ``pids`` (a
    process this one did not start, a grandchild), a ``pidfd``; where the platform has no
    ``pidfd_open`` those are polled every :data:`EXIT_WATCH_POLL_S`. Signals: the watch becomes
    the interpreter's wakeup file descriptor while it is open (main thread only), so a signal
    delivered to any thread ends the sleep; the previous one is restored by :meth:`close`
    (made outside the main thread, the watch polls instead).
    A process that exited wakes the watch once; after that it is no longer watched."""

    def __init__(self, processes: Iterable[Any] = (), pids: Iterable[int] = ()) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._owned: list[int] = []
        self._fds = {self._read}
        #: A process by its sentinel: once the sentinel says it ended, it is reaped before the
        #: wait returns, so the caller reads its exit code (the sentinel closes a moment before
        #: the process can be waited for; a caller that looked then saw it running and slept on).
        self._processes = {process.sentinel: process for process in processes}
        self._fds.update(self._processes)
        self.polled = False
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # gone already: the caller's check finds it
            except (AttributeError, OSError):
                self.polled = True  # no pidfd here: the caller's check, every poll
                continue
            self._owned.append(fd)
            self._fds.add(fd)
        self._previous: int | None = None
        try:
            self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: a signal cannot wake it, so it polls
            self.polled = True

    def wait(self, timeout_s: float = EXIT_WATCH_CEILING_S) -> None:
        """Sleep until a watched process exits, a signal arrives, or ``timeout_s``."""
        limit = EXIT_WATCH_POLL_S if self.polled else EXIT_WATCH_CEILING_S
        ready, _, _ = select.select(list(self._fds), [], [], max(0.0, min(timeout_s, limit)))
        for fd in ready:
            if fd == self._read:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._read, 512):
                        pass
            else:
                self._fds.discard(fd)
                process = self._processes.pop(fd, None)
                if process is not None:
                    process.join(EXIT_WATCH_REAP_S)

    def until(self, deadline: float | None) -> bool:
        """:meth:`wait`, but no later than ``deadline`` (``time.monotonic()``; None: none);
        False, without sleeping, once the deadline has passed."""
        if deadline is None:
            self.wait()
            return True
        left = deadline - time.monotonic()
        if left < 0:
            return False
        self.wait(left)
        return True

    def close(self) -> None:
        if self._previous is not None:
            signal.set_wakeup_fd(self._previous)
        for fd in (self._read, self._write, *self._owned):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._owned.clear()
        self._fds.clear()

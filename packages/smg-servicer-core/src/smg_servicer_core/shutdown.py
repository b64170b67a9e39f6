"""A deadline on stopping: a hung engine shutdown cannot keep the worker alive.

When a launcher starts to stop (a signal, or the engine's death) it arms a
:class:`ShutdownDeadline` of the grace period plus ``--shutdown-margin`` (default 15 s). If the
process is still stopping when it expires, a watchdog thread (it runs even when the event loop is
blocked by a synchronous engine call) kills every process this one started (the engine's
schedulers, cores and workers, by PID), logs one line naming them, and ends the process with exit
code 1 at once (``os._exit``: threads stuck in the engine would otherwise hold the interpreter's
exit).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import psutil

from smg_servicer_core.config import Setting, at_least
from smg_servicer_core.entry import ExitCode

logger = logging.getLogger(__name__)

DEFAULT_SHUTDOWN_MARGIN_S = 15.0

SHUTDOWN_MARGIN = Setting(
    "shutdown_margin_s",
    float,
    DEFAULT_SHUTDOWN_MARGIN_S,
    "seconds the engine's shutdown may take beyond the grace period; then its processes are "
    "killed and the worker exits 1",
    flag="--shutdown-margin",
    env="SMG_SERVICER_SHUTDOWN_MARGIN_S",
    validate=at_least(0.0),
)


def kill_descendants() -> list[int]:
    """SIGKILL every live process this one started, children first found; their PIDs."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    killed: list[int] = []
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            logger.warning("cannot kill engine process %d", child.pid)
            continue
        killed.append(child.pid)
    return killed


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # a broken handler must not keep the process alive
            continue


def _exit(code: int) -> None:
    _flush_logs()
    os._exit(code)


class ShutdownDeadline:
    """Armed once, when stopping starts; disarmed when the engine has stopped in time."""

    def __init__(
        self,
        grace_s: float,
        margin_s: float,
        *,
        kill: Callable[[], list[int]] = kill_descendants,
        exit_process: Callable[[int], None] = _exit,
    ) -> None:
        self.grace_s = grace_s
        self.margin_s = margin_s
        self._kill = kill
        self._exit_process = exit_process
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self.expired = threading.Event()

    @property
    def seconds(self) -> float:
        return self.grace_s + self.margin_s

    def arm(self, grace_s: float | None = None) -> None:
        """Start the clock (idempotent). ``grace_s`` replaces the grace part (0 when the engine
        died: there is nothing to drain)."""
        with self._lock:
            if self._timer is not None:
                return
            if grace_s is not None:
                self.grace_s = grace_s
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.name = "smg-shutdown-deadline"
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _expire(self) -> None:
        self.expired.set()
        pids = self._kill()
        logger.error(
            "shutdown passed its deadline (%.1fs: grace %.1fs + margin %.1fs): killed %s; exit %d",
            self.seconds,
            self.grace_s,
            self.margin_s,
            f"engine processes {', '.join(map(str, pids))}" if pids else "no engine process",
            ExitCode.ENGINE_DIED,
        )
        self._exit_process(int(ExitCode.ENGINE_DIED))

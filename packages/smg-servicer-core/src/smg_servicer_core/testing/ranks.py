"""A stand-in scheduler rank for tests of the headless kit (:mod:`smg_servicer_core.headless`):
a process that serves until it is told to drain, then does what it was told to.

Start it with ``multiprocessing``: under ``fork`` (quick: no interpreter to start) it first puts
back what it inherited from the test's process, the signal handlers and the wakeup descriptor
a supervisor there installed."""

from __future__ import annotations

import os
import signal
from typing import Any

#: What a stand-in rank does on its drain signal: exits 0 (its requests finished), exits 3 (it
#: failed while draining), or goes on (a drain that never ends).
ON_DRAIN_EXIT = {"finish": 0, "fail": 3}


def rank(on_drain: str, drain_signal: int, ready: Any) -> None:
    """Serve (sleep) until ``drain_signal``; then ``on_drain`` (a key of :data:`ON_DRAIN_EXIT`,
    or ``"hang"``). ``ready`` (a ``multiprocessing`` event) is set once the signal is handled.
    SIGTERM keeps its default: the rank dies of it."""

    def drained(signum: int, frame: object) -> None:
        os._exit(ON_DRAIN_EXIT[on_drain])

    signal.set_wakeup_fd(-1)
    for inherited in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(inherited, signal.SIG_DFL)
    signal.signal(drain_signal, signal.SIG_IGN if on_drain == "hang" else drained)
    ready.set()
    while True:
        signal.pause()

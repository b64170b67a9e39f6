"""What every headless launcher of ours shares: the lane's own flags and the supervisor of the
scheduler ranks (engine-free; the supervisor's relay needs the ``zmq`` extra).

A headless launcher starts an engine's scheduler ranks with the engine's own start-up code, aims
them at the router (the direct ZMQ lane, or the Rust lane's server) through a
:class:`~smg_servicer_core.zmq_lane.HandshakeRelay`, and supervises them. An engine supplies its
adapter, what differs: how its ranks start (a callable returning :class:`Ranks`), the signals
that mean a rank failed, the signal that starts a rank's drain, and the code that runs inside
its ranks (the drain itself, the request guard). :func:`supervise` does the rest, the same on
every engine:

- **start**: SIGTERM or SIGINT while the ranks start stops the launch (exit 0); a failure signal
  or one of the adapter's start errors ends it (exit 1). Either way no rank is left running.
- **serve**: a rank that exits unasked, or a failure signal, is an engine death: the dead-engine
  sentinel goes to the router at once (it stops routing to this worker), the other ranks are
  stopped, exit 1.
- **drain** (SIGTERM or SIGINT): each rank gets the drain signal, refuses new requests and exits 0
  once those in flight finish; exit 0 once every rank has, 1 when a rank fails or the drain's
  deadline passes (the requests left are failed).

The main thread sleeps on the ranks' exits and on signals (:class:`~.watchdog.ExitWatch`), not
on a timer. Exit codes are core's table (:class:`~smg_servicer_core.entry.ExitCode`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from smg_servicer_core.entry import ExitCode, configure_logging
from smg_servicer_core.watchdog import ExitWatch

logger = logging.getLogger(__name__)

#: How long a SIGTERM's drain waits for the requests in flight, unless ``--zmq-drain-timeout``.
DRAIN_S = 30.0
#: How long a rank has to stop (SIGTERM) before it is killed.
STOP_S = 5.0


class Relay(Protocol):
    """What the supervisor needs of the relay between the ranks and the router
    (:class:`~smg_servicer_core.zmq_lane.HandshakeRelay`)."""

    def outputs(self) -> list[str]:
        """The router's output addresses, once a rank's handshake has passed (else empty)."""
        ...

    def send_dead(self) -> list[str]:
        """The dead-engine sentinel to each of them; the ones told."""
        ...


# -- the lane's flags ----------------------------------------------------------------------------


def add_lane_flags(
    parser: argparse.ArgumentParser,
    *,
    fallback: str,
    drain: bool = True,
    engine_index: bool = False,
) -> None:
    """The flags every headless launcher takes on ``parser``: where the router's handshake is
    (``--zmq-handshake-address`` or ``--zmq-worker-url``; ``fallback`` says what is used without
    them), and with ``drain`` ``--zmq-drain-timeout``, with ``engine_index``
    ``--zmq-engine-index``. :func:`check_lane_flags` validates what was parsed."""
    parser.add_argument(
        "--zmq-handshake-address",
        default=None,
        help="the router's ZMQ handshake, tcp://HOST:PORT (for an ipc:// worker URL the router "
        f"listens on 127.0.0.1 at the port it derives from the URL); default: {fallback}",
    )
    parser.add_argument(
        "--zmq-worker-url",
        default=None,
        help="the router's ipc:// worker URL, from which the handshake address is derived "
        "(instead of --zmq-handshake-address)",
    )
    if engine_index:
        parser.add_argument(
            "--zmq-engine-index", type=int, default=0, help="the engine index to register as (0)"
        )
    if drain:
        parser.add_argument(
            "--zmq-drain-timeout",
            type=float,
            default=DRAIN_S,
            help=f"seconds a SIGTERM waits for the requests in flight ({DRAIN_S:.0f})",
        )


def check_lane_flags(
    ours: argparse.Namespace, *, fallback: str | None = None, required: bool = True
) -> None:
    """Resolve ``ours.zmq_handshake_address`` from the two handshake flags, else ``fallback`` (a
    ``tcp://`` address, or None for none; left None when neither is given and not ``required``:
    the engine's own flags name it), and check the other lane flags parsed; ``ValueError`` (a
    configuration error: exit 2, one line) for a bad one."""
    from smg_servicer_core.zmq_lane import handshake_address  # noqa: PLC0415 - the zmq extra

    address, url = ours.zmq_handshake_address, ours.zmq_worker_url
    if address is None and url is None:
        address = fallback
    if required or address is not None or url is not None:
        ours.zmq_handshake_address = handshake_address(address, url)
    index = getattr(ours, "zmq_engine_index", 0)
    if not 0 <= index <= 0xFFFF:
        raise ValueError(f"--zmq-engine-index must be in 0..65535, got {index}")
    if getattr(ours, "zmq_drain_timeout", 0) < 0:
        raise ValueError("--zmq-drain-timeout must be >= 0")


def launcher_main(
    argv: Sequence[str],
    parse: Callable[[Sequence[str]], tuple[argparse.Namespace, list[str]]],
    run: Callable[[argparse.Namespace, list[str]], int],
    *,
    engine_module: str | None = None,
) -> int:
    """A headless launcher's ``main``: ``parse`` its command line (our flags, the engine's rest;
    a ``ValueError`` is a configuration error: exit 2, one line), set up logging, import
    ``engine_module`` (missing: exit 2 naming it), then ``run``; the exit code."""
    try:
        ours, rest = parse(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    configure_logging("info")
    if engine_module is not None:
        try:
            importlib.import_module(engine_module)
        except ImportError as err:
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.CONFIG
    return run(ours, rest)


# -- the ranks -----------------------------------------------------------------------------------


def terminate(processes: Sequence[Any], timeout_s: float) -> None:
    """SIGTERM each process still alive, wait up to ``timeout_s`` in all, SIGKILL what is left;
    every one is reaped."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0))
        if process.is_alive():
            logger.warning("scheduler rank %s did not stop; killing it", process.pid)
            process.kill()
            process.join(1)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited: no such process, or a zombie its parent has not
    reaped yet (read from ``/proc`` where there is one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[:1] == ["Z"]
    except OSError:
        return False


@dataclass
class Ranks:
    """An engine's scheduler ranks, started: the adapter's answer to "start them".

    ``processes``: the ranks this launcher started (``multiprocessing`` processes: their exit
    codes are known). ``others``: rank processes it did not start itself (a DP controller's ranks,
    by pid): watched and signalled with the rest; an exit there has no known code. ``stop``: how
    the engine's ranks are stopped (its timeout in seconds); :func:`terminate` unless given."""

    processes: Sequence[Any]
    others: Sequence[int] = ()
    stop: Callable[[float], None] | None = None
    #: What else ends with the ranks (a load reader): called once after ``stop``.
    closers: list[Callable[[], None]] = field(default_factory=lambda: [])

    def pids(self) -> list[int]:
        return sorted({p.pid for p in self.processes if p.pid} | set(self.others))

    def exits(self) -> list[tuple[int, int | None]]:
        """``(pid, exit code)`` of each rank that has exited (the code None where unknown)."""
        done: list[tuple[int, int | None]] = [
            (p.pid, p.exitcode) for p in self.processes if p.exitcode is not None
        ]
        return done + [(pid, None) for pid in self.others if _gone(pid)]

    def count(self) -> int:
        return len(self.pids())

    def end(self, timeout_s: float) -> None:
        if self.stop is not None:
            self.stop(timeout_s)
        else:
            terminate(self.processes, timeout_s)
        for close in self.closers:
            close()


class Supervisor:
    """The ranks after they started: watch them, drain them on a signal, tell the router."""

    def __init__(
        self,
        ranks: Ranks,
        relay: Relay,
        *,
        drain_s: float,
        drain_signal: int,
        failure_signals: Sequence[int],
        stop_s: float = STOP_S,
    ) -> None:
        self.ranks = ranks
        self.relay = relay
        self.drain_s = drain_s
        self.drain_signal = drain_signal
        self.failure_signals = tuple(failure_signals)
        self.stop_s = stop_s
        self.stop_asked = False
        self.failure: str | None = None

    def on_signal(self, signum: int, frame: object) -> None:
        if signum in self.failure_signals:
            name = signal.Signals(signum).name
            self.failure = f"a scheduler rank reported a fatal error ({name})"
        else:
            self.stop_asked = True

    def verdict(self, draining: bool) -> tuple[int, str] | None:
        """How the launcher ends now, ``(exit code, why)``, or None while it serves (or drains)."""
        if self.failure is not None:
            return ExitCode.ENGINE_DIED, self.failure
        exits = self.ranks.exits()
        for pid, code in exits:
            if not draining or code not in (0, None):
                how = "exited" if code is None else f"exited with code {code}"
                return ExitCode.ENGINE_DIED, f"scheduler rank {pid} {how}"
        if draining and len(exits) >= self.ranks.count():
            return ExitCode.OK, "every request finished"
        return None

    def _drain(self) -> None:
        for pid in self.ranks.pids():
            try:
                os.kill(pid, self.drain_signal)
            except ProcessLookupError:
                continue  # exited: the next verdict reads how

    def run(self) -> int:
        watch = ExitWatch(self.ranks.processes, self.ranks.others)
        try:
            return self._run(watch)
        finally:
            watch.close()

    def _run(self, watch: ExitWatch) -> int:
        deadline: float | None = None
        while True:
            verdict = self.verdict(draining=deadline is not None)
            if verdict is not None:
                code, why = verdict
                if code == ExitCode.OK:
                    logger.info("drained (%s)", why)
                else:
                    told = self.relay.send_dead()
                    logger.error("%s: told the router (%d output socket(s))", why, len(told))
                return code
            if self.stop_asked and deadline is None:
                deadline = time.monotonic() + self.drain_s
                logger.info("draining for up to %.0fs: new requests are refused", self.drain_s)
                self._drain()
            if not watch.until(deadline):
                logger.error("the drain ran out of time; the requests left are failed")
                return ExitCode.ENGINE_DIED

    def close(self) -> None:
        """The sentinel (the router stops routing here), then the ranks stop."""
        self.relay.send_dead()
        self.ranks.end(self.stop_s)


# -- start, then serve ---------------------------------------------------------------------------


class _Stop(Exception):
    """A signal while the ranks start: a stop, or a failure signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _stop_in(err: BaseException | None) -> _Stop | None:
    """The signal an error stands for: itself, or what it was raised from (an engine's start-up
    code may wrap what interrupted it)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, _Stop):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


@dataclass
class Adapter:
    """What an engine tells :func:`supervise`: how its ranks start and signal."""

    #: Start this node's ranks (they dial the relay) and return them once every one is ready;
    #: raises one of ``start_errors`` when one fails to start.
    start: Callable[[], Ranks]
    #: The signal a rank's drain starts on (each engine's in-rank code handles it).
    drain_signal: int
    #: What a rank sends the launcher when it fails (SIGQUIT: SGLang's and TokenSpeed's
    #: launch-phase teardown); a failure, not a stop.
    failure_signals: tuple[int, ...] = (signal.SIGQUIT,)
    start_errors: tuple[type[BaseException], ...] = ()
    #: How long a rank has to stop.
    stop_s: float = STOP_S
    #: Said (and exit 1) when the ranks are ready but none dialed the relay; None: not checked.
    not_dialed: str | None = None


def supervise(relay: Relay, adapter: Adapter, drain_s: float) -> int:
    """Start the adapter's ranks and supervise them until a signal or a death; the exit code."""
    stops = (signal.SIGTERM, signal.SIGINT, *adapter.failure_signals)
    for sig in stops:
        signal.signal(sig, _raise_stop)
    try:
        ranks = adapter.start()
    except (_Stop, *adapter.start_errors) as err:
        terminate(multiprocessing.active_children(), adapter.stop_s)
        stop = _stop_in(err)
        if stop is not None and stop.signum not in adapter.failure_signals:
            logger.info("asked to stop while the ranks started")
            return ExitCode.OK
        if stop is None:
            logger.error("the scheduler could not start: %s", err)
        else:
            name = signal.Signals(stop.signum).name
            logger.error("a scheduler rank failed while starting (%s)", name)
        return ExitCode.ENGINE_DIED
    supervisor = Supervisor(
        ranks,
        relay,
        drain_s=drain_s,
        drain_signal=adapter.drain_signal,
        failure_signals=adapter.failure_signals,
        stop_s=adapter.stop_s,
    )
    for sig in stops:
        signal.signal(sig, supervisor.on_signal)
    try:
        if adapter.not_dialed is not None and not relay.outputs():
            logger.error("%s", adapter.not_dialed)
            return ExitCode.ENGINE_DIED
        logger.info("the scheduler is registered; serving")
        return supervisor.run()
    finally:
        supervisor.close()

"""SGLang's scheduler ranks headless for the router's direct ZMQ lane (no Python on the token path).

    python -m smg_grpc_servicer.sglang.headless --zmq-handshake-address tcp://127.0.0.1:PORT \\
        [--zmq-engine-index N] --model-path MODEL [SGLang's server flags]
    smg launch --worker-urls ipc:///run/smg/engine-0 --backend sglang --model-path MODEL

What ``smg serve --backend sglang --connection-mode zmq`` launches. No HTTP server, no tokenizer
manager, no detokenizer: this process starts SGLang's own scheduler ranks (SGLang's own spawner)
and supervises them; the rank that owns request I/O dials the router itself, through the
``smg-zmq`` plugin (:mod:`smg_servicer_sglang.zmq_plugin`), and the router speaks SGLang's
scheduler structs to it (:mod:`smg_servicer_sglang.zmq_wire`).

- **Engine death is told at once.** The scheduler dials the router through a relay here
  (:class:`~smg_servicer_core.zmq_lane.HandshakeRelay`), which learns where the router takes
  outputs; when a rank exits unasked (killed, crashed, or SGLang's SIGQUIT), the launcher sends
  the dead-engine sentinel there on its behalf, stops the other ranks and exits 1.
- **SIGTERM drains**: new requests are refused with 503, those in flight finish (up to
  ``--zmq-drain-timeout``, 30 s), then the sentinel, exit 0 (1 when the drain ran out of time).
- **Bad input cannot reach the scheduler**: the plugin refuses what SGLang's front end would (an
  empty prompt, a token id outside the vocabulary, sampling parameters SGLang rejects), status 400.
- **Load is visible**: every output batch carries the scheduler's load (running, waiting, KV
  tokens used and total), which the router reads for ``/get_loads`` and load-aware policies.

Not on this lane (refused at start, exit 2): data parallelism (``--dp-size`` > 1, as ``smg serve``
itself refuses it), prefill/decode roles (the router's SGLang ZMQ client serves neither) and LoRA
(``--enable-lora``: adapter names, loads and in-use counts are the Python lane's; a request naming
an adapter is refused with 400 here); use the gRPC lane. Exit codes are core's table
(:class:`smg_servicer_core.entry.ExitCode`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Generator, Sequence
from importlib.metadata import entry_points
from typing import Any

from smg_servicer_core.entry import ExitCode, configure_logging
from smg_servicer_core.watchdog import ExitWatch
from smg_servicer_core.zmq_lane import HandshakeRelay, handshake_address
from smg_servicer_sglang import zmq_wire
from smg_servicer_sglang.zmq_plugin import DRAIN_SIGNAL, ENGINE_INDEX_ENV, HANDSHAKE_ENV

logger = logging.getLogger(__name__)

#: How long a SIGTERM's drain waits for the requests in flight.
DRAIN_S = 30.0
#: How long a rank has to stop before it is killed.
STOP_S = 2.0
#: Where SGLang looks for plugins, and ours (smg-servicer-sglang's pyproject.toml).
PLUGIN_GROUP, PLUGIN_NAME = "sglang.srt.plugins", "smg-zmq"


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags, and the rest for SGLang's own parser. ``ValueError`` for a bad one of ours."""
    parser = argparse.ArgumentParser(prog="python -m smg_grpc_servicer.sglang.headless")
    parser.add_argument(
        "--zmq-handshake-address",
        default=None,
        help="the router's ZMQ handshake, tcp://HOST:PORT (for an ipc:// worker URL the router "
        "listens on 127.0.0.1 at the port it derives from the URL)",
    )
    parser.add_argument(
        "--zmq-worker-url",
        default=None,
        help="the router's ipc:// worker URL, from which the handshake address is derived "
        "(instead of --zmq-handshake-address)",
    )
    parser.add_argument(
        "--zmq-engine-index", type=int, default=0, help="the engine index to register as (0)"
    )
    parser.add_argument(
        "--zmq-drain-timeout",
        type=float,
        default=DRAIN_S,
        help=f"seconds a SIGTERM waits for the requests in flight ({DRAIN_S:.0f})",
    )
    ours, rest = parser.parse_known_args(list(argv))
    ours.zmq_handshake_address = handshake_address(ours.zmq_handshake_address, ours.zmq_worker_url)
    if not 0 <= ours.zmq_engine_index <= 0xFFFF:
        raise ValueError(f"--zmq-engine-index must be in 0..65535, got {ours.zmq_engine_index}")
    if ours.zmq_drain_timeout < 0:
        raise ValueError("--zmq-drain-timeout must be >= 0")
    return ours, rest


def plugin_missing() -> str | None:
    """Why SGLang would not load our ``smg-zmq`` plugin in its scheduler, or None: without it the
    scheduler would start in its usual mode and never dial the router."""
    found = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if not found:
        return (
            f"the {PLUGIN_NAME} SGLang plugin ({PLUGIN_GROUP} entry point) is not installed in "
            "this environment: reinstall smg-servicer-sglang"
        )
    return None


def unsupported(config: Any) -> str | None:
    """Why SGLang's resolved settings cannot run on this lane, or None."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415

    if getattr(config, "enable_lora", False):
        return f"--enable-lora: {zmq_wire.LORA_ON_PYTHON_LANE}"
    if sg.dp_size() > 1:
        return "--dp-size > 1 is not served over SGLang's ZMQ wire: use the Python gRPC lane"
    if sg.disaggregation_mode(config) != "null":
        return "prefill/decode roles are not served over SGLang's ZMQ wire"
    return None


class _Stop(Exception):
    """A signal while the ranks start: a stop, or SIGQUIT (a rank failed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Supervisor:
    """The ranks after they started: watch them, drain them on a signal, tell the router."""

    def __init__(self, launched: Any, relay: HandshakeRelay, drain_s: float) -> None:
        self.launched = launched
        self.relay = relay
        self.drain_s = drain_s
        self.stop_asked = False
        self.quit_reason: str | None = None

    def on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGQUIT:
            self.quit_reason = "a scheduler rank reported a fatal error (SIGQUIT)"
        else:
            self.stop_asked = True

    def _ranks(self) -> list[int]:
        pids = {p.pid for p in self.launched.processes if p.pid} | set(self.launched.pids)
        return sorted(pids)

    def run(self) -> int:
        watch = ExitWatch(self.launched.processes, self._ranks())
        try:
            return self._run(watch)
        finally:
            watch.close()

    def _run(self, watch: ExitWatch) -> int:
        drain_deadline: float | None = None
        while True:
            dead = self.quit_reason or self.launched.dead()
            if dead is not None and drain_deadline is None:
                told = self.relay.send_dead()
                logger.error("%s: told the router (%d output socket(s))", dead, len(told))
                return ExitCode.ENGINE_DIED
            if dead is not None:
                codes = [p.exitcode for p in self.launched.processes if p.exitcode is not None]
                clean = all(code == 0 for code in codes)
                logger.info("drained (%s)", dead if not clean else "every request finished")
                return ExitCode.OK if clean else ExitCode.ENGINE_DIED
            if self.stop_asked and drain_deadline is None:
                drain_deadline = time.monotonic() + self.drain_s
                logger.info("draining for up to %.0fs: new requests are refused", self.drain_s)
                for pid in self._ranks():
                    try:
                        os.kill(pid, DRAIN_SIGNAL)
                    except ProcessLookupError:
                        continue
            if not watch.until(drain_deadline):
                logger.error("the drain ran out of time; the requests left are failed")
                return ExitCode.ENGINE_DIED

    def close(self) -> None:
        from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415

        self.relay.send_dead()
        sg.terminate(self.launched.processes, STOP_S, self.launched.pids)
        if self.launched.load_reader is not None:
            self.launched.load_reader.close()


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


@contextlib.contextmanager
def dialing(handshake: str, engine_index: int) -> Generator[HandshakeRelay]:
    """The relay in front of ``handshake``, and this process's environment set so that the
    scheduler ranks it starts load the plugin and dial the relay as engine ``engine_index``."""
    relay = HandshakeRelay(handshake)
    try:
        # The ranks inherit this process's environment: the one way to hand them these.
        os.environ[HANDSHAKE_ENV] = relay.address  # noqa: TID251
        os.environ[ENGINE_INDEX_ENV] = str(engine_index)  # noqa: TID251
        yield relay
    finally:
        relay.close()


def prepared(server_args: Any) -> tuple[Any, Any] | str:
    """SGLang's port args and resolved settings for ``server_args`` on this lane, or why not."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415

    try:
        port_args, config = sg.prepare(server_args)
    except (ValueError, TypeError) as err:
        return str(err)
    return unsupported(config) or plugin_missing() or (port_args, config)


def supervise(relay: HandshakeRelay, server_args: Any, port_args: Any, drain_s: float) -> int:
    """Start the ranks (they dial ``relay``), supervise them until a signal or a death; the exit
    code."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, _raise_stop)
    try:
        launched = sg.launch_schedulers(server_args, port_args)
    except (sg.SchedulerStartError, _Stop) as err:
        stop = err if isinstance(err, _Stop) else err.__cause__
        if isinstance(stop, _Stop) and stop.signum != signal.SIGQUIT:
            return ExitCode.OK  # asked to stop while starting
        logger.error("the scheduler could not start: %s", err)
        return ExitCode.ENGINE_DIED
    supervisor = Supervisor(launched, relay, drain_s)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, supervisor.on_signal)
    if not relay.outputs():  # the scheduler is ready only once it has registered
        supervisor.close()
        logger.error(
            "the scheduler started without dialing its handshake: SGLang did not run the %s "
            "plugin in it (SGLANG_PLATFORM? a failed load?)",
            PLUGIN_NAME,
        )
        return ExitCode.ENGINE_DIED
    logger.info("the scheduler is registered; serving")
    try:
        return supervisor.run()
    finally:
        supervisor.close()


def run(ours: argparse.Namespace, server_argv: list[str]) -> int:
    """Start the ranks aimed at the router, supervise them; the exit code."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415

    with dialing(ours.zmq_handshake_address, ours.zmq_engine_index) as relay:
        try:
            server_args = sg.prepare_server_args(server_argv)
        except (ValueError, TypeError) as err:
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.CONFIG
        ready = prepared(server_args)
        if isinstance(ready, str):
            print(f"error: {ready}", file=sys.stderr)
            return ExitCode.CONFIG
        port_args, _ = ready
        logger.info(
            "starting SGLang's scheduler for the router at %s (engine %d)",
            ours.zmq_handshake_address,
            ours.zmq_engine_index,
        )
        return supervise(relay, server_args, port_args, ours.zmq_drain_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ours, rest = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    configure_logging("info")
    return run(ours, rest)


if __name__ == "__main__":
    sys.exit(main())

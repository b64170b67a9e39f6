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

The lane's flags, the start, the supervision, the drain's deadline and a death told to the
router are core's headless kit (:mod:`smg_servicer_core.headless`), the same as TokenSpeed's;
this module is SGLang's adapter to it, and the drain and the input guard inside the ranks are
the plugin's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Generator, Sequence
from importlib.metadata import entry_points
from typing import Any

from smg_servicer_core.entry import ExitCode
from smg_servicer_core.headless import (
    Adapter,
    Ranks,
    add_lane_flags,
    check_lane_flags,
    launcher_main,
)
from smg_servicer_core.headless import supervise as core_supervise
from smg_servicer_core.zmq_lane import HandshakeRelay
from smg_servicer_sglang import zmq_wire
from smg_servicer_sglang.zmq_plugin import DRAIN_SIGNAL, ENGINE_INDEX_ENV, HANDSHAKE_ENV

logger = logging.getLogger(__name__)

#: How long a rank has to stop before it is killed.
STOP_S = 2.0
#: Where SGLang looks for plugins, and ours (smg-servicer-sglang's pyproject.toml).
PLUGIN_GROUP, PLUGIN_NAME = "sglang.srt.plugins", "smg-zmq"


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags (core's lane flags), and the rest for SGLang's own parser. ``ValueError`` for a
    bad one of ours."""
    parser = argparse.ArgumentParser(prog="python -m smg_grpc_servicer.sglang.headless")
    add_lane_flags(parser, fallback="none: one of the two is needed", engine_index=True)
    ours, rest = parser.parse_known_args(list(argv))
    check_lane_flags(ours)
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
    if getattr(config, "language_only", False):
        return (
            "--language-only (encoder disaggregation) is not served over SGLang's ZMQ wire: use "
            "the Python gRPC lane"
        )
    if sg.dp_size() > 1:
        return "--dp-size > 1 is not served over SGLang's ZMQ wire: use the Python gRPC lane"
    if sg.disaggregation_mode(config) != "null":
        return "prefill/decode roles are not served over SGLang's ZMQ wire"
    return None


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
    """Start the ranks (they dial ``relay``), supervise them until a signal or a death (core's
    supervisor); the exit code."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415

    def start() -> Ranks:
        launched = sg.launch_schedulers(server_args, port_args)
        own = {p.pid for p in launched.processes}
        reader = launched.load_reader
        return Ranks(
            launched.processes,
            others=[pid for pid in launched.pids if pid not in own],
            stop=lambda timeout_s: sg.terminate(launched.processes, timeout_s, launched.pids),
            closers=[] if reader is None else [reader.close],
        )

    adapter = Adapter(
        start,
        drain_signal=DRAIN_SIGNAL,
        start_errors=(sg.SchedulerStartError,),
        stop_s=STOP_S,
        not_dialed="the scheduler started without dialing its handshake: SGLang did not run the "
        f"{PLUGIN_NAME} plugin in it (SGLANG_PLATFORM? a failed load?)",
    )
    return core_supervise(relay, adapter, drain_s)


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
    return launcher_main(sys.argv[1:] if argv is None else argv, parse, run)


if __name__ == "__main__":
    sys.exit(main())

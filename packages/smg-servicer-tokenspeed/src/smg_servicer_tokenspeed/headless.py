"""TokenSpeed's scheduler ranks headless for the router's direct ZMQ lane (no Python on the token
path).

    python -m smg_grpc_servicer.tokenspeed.headless --zmq-worker-url ipc:///run/smg/engine-0 \\
        --model MODEL [TokenSpeed's server flags]
    smg launch --worker-urls ipc:///run/smg/engine-0 --backend tokenspeed --model-path MODEL

The router (``smg`` 1.13) speaks TokenSpeed's msgpack scheduler wire itself: it binds the
handshake and data-plane sockets and TokenSpeed's scheduler dials in
(``tokenspeed.runtime.engine.zmq_msgpack``), exactly as under ``ts serve --headless``, which is
what ``smg serve --backend tokenspeed --connection-mode zmq`` launches. This launcher starts the
same ranks with TokenSpeed's own start-up code and adds what ``ts serve --headless`` lacks:

- **Engine death is told at once.** A killed rank sends nothing, and the router would keep
  routing to it for minutes. The ranks dial the router through a relay here
  (:class:`~smg_servicer_core.zmq_lane.HandshakeRelay`), which learns where the router takes
  outputs; when a rank exits unasked (killed, crashed, or TokenSpeed's SIGUSR1 for a scheduler
  exception), the launcher sends the dead-engine sentinel there on its behalf, stops the other
  ranks and exits 1.
- **SIGTERM drains** (``ts serve --headless`` terminates its ranks, failing what is in flight):
  new requests are refused (they end at once with an abort), those in flight finish, up to
  ``--zmq-drain-timeout`` (30 s); then each rank stops the way TokenSpeed's own loop stops (its
  sentinel tells the router), exit 0 (1 when the drain ran out of time).
- **Bad input cannot reach the model**: a prompt the one prompt rule of every lane refuses (core's
  ``validate.prompt_refusal``: no tokens, a token id outside the vocabulary, a prompt that fills
  the context; the Python lane's words) is ended with an abort before the scheduler runs it, as
  TokenSpeed's wire already does for bad sampling parameters.
- **Load is visible**: TokenSpeed's scheduler puts its load (running, waiting, KV pages) on every
  output batch; the router reads it for ``/get_loads`` and load-aware policies.
- **The model's identity**: the ranks register with ``--served-model-name`` (else the model
  path); the router names the model from its own ``--model-path``.

The drain and the input check run inside each rank (:class:`RankGuard`, installed around
TokenSpeed's ``connect_msgpack_engine`` before the rank's loop starts); nothing of ours is
between the router and the scheduler's sockets.

``--zmq-handshake-address`` or ``--zmq-worker-url`` names the router's handshake; without them,
TokenSpeed's own ``--data-parallel-address``/``--data-parallel-rpc-port`` (what ``smg serve``
passes to ``ts serve --headless``). Not on this lane (refused, exit 2): attention data parallelism
and prefill/decode/encode roles; use the gRPC lane. Exit codes are core's table
(:class:`smg_servicer_core.entry.ExitCode`).

The lane's flags, the start, the supervision, the drain's deadline and a death told to the
router are core's headless kit (:mod:`smg_servicer_core.headless`), the same as SGLang's; this
module is TokenSpeed's adapter to it and the code inside each rank (:class:`RankGuard`).
"""

# TokenSpeed ships no type information; its structs are read loosely on purpose.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportAttributeAccessIssue=false
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from smg_servicer_core.entry import ExitCode, configure_logging
from smg_servicer_core.headless import (
    Adapter,
    Ranks,
    add_lane_flags,
    check_lane_flags,
    launcher_main,
)
from smg_servicer_core.headless import supervise as core_supervise
from smg_servicer_core.validate import prompt_refusal
from smg_servicer_core.zmq_lane import HandshakeRelay

logger = logging.getLogger(__name__)

#: How long a rank has to stop before it is killed.
STOP_S = 5.0
#: What the launcher sends each rank to start its drain (TokenSpeed uses SIGUSR1 and SIGTERM).
DRAIN_SIGNAL = signal.SIGUSR2
#: The message of a request refused while the worker drains.
DRAINING = "the worker is shutting down: retry on another worker"


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags (core's lane flags), and the rest for TokenSpeed's own parser. ``ValueError``
    for a bad one of ours."""
    parser = argparse.ArgumentParser(prog="python -m smg_grpc_servicer.tokenspeed.headless")
    fallback = "TokenSpeed's --data-parallel-address and --data-parallel-rpc-port"
    add_lane_flags(parser, fallback=fallback)
    ours, rest = parser.parse_known_args(list(argv))
    check_lane_flags(ours, required=False)
    return ours, rest


def unsupported(server_args: Any) -> str | None:
    """Why TokenSpeed's settings cannot run on this lane, or None."""
    from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415

    if ts.dp_size(server_args) > 1:
        return "attention data parallelism is not served by this launcher: use the gRPC lane"
    if ts.disaggregation_mode(server_args) != "null":
        return "prefill/decode/encode roles are not served by this launcher: use the gRPC lane"
    return None


# -- inside each rank --------------------------------------------------------------------------


class RankGuard:
    """One rank's side of the lane: wraps the sockets TokenSpeed's ``connect_msgpack_engine``
    returns, to refuse bad input and to drain.

    It counts the requests the scheduler admitted and has not finished (from the requests it
    receives and the output batches it sends). On :data:`DRAIN_SIGNAL` every new request is
    refused; once none is left the rank gets SIGTERM, which TokenSpeed's loop takes as its stop
    (the current step finishes, the dead-engine sentinel goes to the router)."""

    def __init__(self, kill: Callable[[], None]) -> None:
        self.kill = kill
        self.draining = False
        self.stopped = False
        self.in_flight: set[str] = set()

    def on_drain(self, signum: int, frame: object) -> None:
        self.draining = True
        self._maybe_stop()

    def _maybe_stop(self) -> None:
        if self.draining and not self.in_flight and not self.stopped:
            self.stopped = True
            self.kill()

    def received(self, obj: Any, vocab_size: int, context: int) -> None:
        from smg_servicer_tokenspeed._tokenspeed import io  # noqa: PLC0415

        if isinstance(obj, io.AbortReq):
            logger.info("the router aborts %s", obj.rid)
            self.in_flight.discard(str(obj.rid))
            self._maybe_stop()
            return
        if not isinstance(obj, io.TokenizedGenerateReqInput) or obj.validation_error:
            return
        # The one prompt rule of every lane (core's), in the Python lane's words.
        reason = DRAINING if self.draining else prompt_refusal(obj.input_ids, vocab_size, context)
        if reason:
            logger.warning("refused %s: %s", obj.rid, reason)
            obj.validation_error = reason
            return
        self.in_flight.add(str(obj.rid))

    def sent(self, obj: Any) -> None:
        rids = getattr(obj, "rids", None) or ()
        finishes = getattr(obj, "finished_reasons", None) or ()
        for rid, finished in zip(rids, finishes, strict=False):
            if finished is not None:
                self.in_flight.discard(str(rid))
        self._maybe_stop()

    def wrap(self, recv: Any, send: Any, vocab_size: int, context: int) -> None:
        """Put this guard around TokenSpeed's msgpack sockets (instance attributes: the classes
        stay TokenSpeed's)."""
        receive, forward = recv.recv_pyobj, send.send_pyobj

        def recv_pyobj(flags: int = 0) -> Any:
            obj = receive(flags)
            self.received(obj, vocab_size, context)
            return obj

        def send_pyobj(obj: Any) -> None:
            forward(obj)
            self.sent(obj)

        recv.recv_pyobj = recv_pyobj
        send.send_pyobj = send_pyobj


def install_guard() -> RankGuard:
    """The guard around TokenSpeed's ``connect_msgpack_engine`` in this rank, and its drain
    signal."""
    from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415

    guard = RankGuard(lambda: os.kill(os.getpid(), signal.SIGTERM))
    connect = ts.zmq_msgpack.connect_msgpack_engine

    def guarded(
        context: Any, address: str, index: int, ready: Any, vocab_size: int, **kw: Any
    ) -> Any:
        recv, send = connect(context, address, index, ready, vocab_size, **kw)
        guard.wrap(recv, send, int(vocab_size), int(ready.max_model_len or 0))
        return recv, send

    ts.zmq_msgpack.connect_msgpack_engine = guarded
    signal.signal(DRAIN_SIGNAL, guard.on_drain)
    return guard


def rank_main(server_args: Any, port_args: Any, pipe_writer: Any) -> None:
    """A scheduler rank's entry (``run_event_loop``'s signature): the guard, then TokenSpeed's loop
    (or the replacement ``SMG_TOKENSPEED_SCHEDULER`` names)."""
    from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415

    configure_logging("info")
    install_guard()
    ts.scheduler_entry()(server_args, port_args, pipe_writer)


# -- the launcher ------------------------------------------------------------------------------


#: What a rank sends its launcher when its loop fails (TokenSpeed's ``register_usr_signal``), and
#: SIGQUIT (TokenSpeed's launch-phase teardown): a failure, not a stop.
FAILURE_SIGNALS = (signal.SIGUSR1, signal.SIGQUIT)


def supervise(relay: HandshakeRelay, server_args: Any, drain_s: float) -> int:
    """Start the ranks (they dial ``relay``), supervise them until a signal or a death (core's
    supervisor); the exit code."""
    from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415

    host, _, port = relay.address.removeprefix("tcp://").rpartition(":")
    ts.aim_headless(server_args, host, int(port))
    adapter = Adapter(
        lambda: Ranks(ts.launch_headless(server_args, rank_main)),
        drain_signal=DRAIN_SIGNAL,
        failure_signals=FAILURE_SIGNALS,
        start_errors=(ts.LaunchError,),
        stop_s=STOP_S,
    )
    return core_supervise(relay, adapter, drain_s)


def run(ours: argparse.Namespace, server_argv: list[str]) -> int:
    """Start the ranks aimed at the router, supervise them; the exit code."""
    from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415

    try:
        server_args = ts.prepare_headless(server_argv)
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    why = unsupported(server_args)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return ExitCode.CONFIG
    upstream = ours.zmq_handshake_address or server_args.zmq_handshake_endpoint()
    relay = HandshakeRelay(upstream)
    try:
        logger.info("starting TokenSpeed's scheduler for the router at %s", upstream)
        return supervise(relay, server_args, ours.zmq_drain_timeout)
    finally:
        relay.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return launcher_main(argv, parse, run, engine_module="smg_servicer_tokenspeed._tokenspeed")


if __name__ == "__main__":
    sys.exit(main())

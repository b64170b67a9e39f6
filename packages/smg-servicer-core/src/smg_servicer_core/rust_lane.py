"""What every engine's Rust servicer lane (``--servicer-impl rust``, issue #26) shares
(engine-free).

The ``smg`` wheel (>= 1.12) ships ``smg.servicer.{Vllm,Sglang,TokenSpeed}GrpcServer``: a Rust
gRPC server answering an engine's proto from a Rust thread, talking to that engine's headless
processes over ZMQ. Python keeps only the lifecycle: construct the server, start the engine
headless dialing the server's handshake, poll ``engine_ready``, ``set_serving``, ``stop``. Each
engine package builds its lane from these pieces: the ``--servicer-impl`` setting
(:func:`impl_setting`), the binding lookup (:func:`binding`), the constructor's accepted keywords
(:func:`accepted_keywords`, :func:`keep_accepted`), what no lane serves (:func:`refuse_unserved`),
the start-up line (:func:`impl_line`), the drain setting of a self-supervised engine
(:func:`drain_setting`) and :class:`Lifecycle` (SERVING once the engine is connected, NOT_SERVING
first thing on SIGTERM/SIGINT); :func:`serve_engine` puts them together around the engine's own
start and supervision."""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any

from smg_servicer_core.config import ResolvedSettings, Setting
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError

logger = logging.getLogger(__name__)

IMPLS = ("python", "rust")
#: The module of the ``smg`` wheel that carries the servers.
BINDING = "smg.servicer"
#: How often the lifecycle looks at the engine while it connects.
POLL_S = 0.1
#: What the server gets to close its connections when it stops.
STOP_S = 5.0


#: The setting's name in every engine's resolved settings.
IMPL_NAME = "servicer_impl"


def impl_setting(engine: str, not_served: str) -> Setting[str]:
    """``--servicer-impl`` / ``SMG_<ENGINE>_SERVICER_IMPL`` (flag > variable > python)."""
    return Setting(
        IMPL_NAME,
        str,
        "python",
        f"the gRPC servicer: python (this package's) or rust (the smg wheel's Rust server over "
        f"the engine's headless processes; {not_served})",
        flag="--servicer-impl",
        env=f"SMG_{engine.upper()}_SERVICER_IMPL",
        validate=lambda v: None if v in IMPLS else f"must be one of {', '.join(IMPLS)}",
    )


def drain_setting(engine: str) -> Setting[float]:
    """``SMG_<ENGINE>_DRAIN_TIMEOUT_S``: how long a SIGTERM waits for the streams in flight on a
    lane whose engine the launcher supervises itself (SGLang's, TokenSpeed's)."""
    return Setting(
        "drain_timeout_s",
        float,
        30.0,
        "seconds a SIGTERM waits for the streams in flight on the Rust lane",
        env=f"SMG_{engine.upper()}_DRAIN_TIMEOUT_S",
        validate=lambda v: None if v >= 0 else "must be >= 0",
    )


def impl_line(settings: ResolvedSettings) -> str:
    """The line a worker logs at start: the implementation a resolved ``--servicer-impl`` chose
    (:func:`impl_setting`) and where the choice came from."""
    return describe_impl(settings[IMPL_NAME], settings.source(IMPL_NAME))


def describe_impl(impl: str, source: str) -> str:
    return f"servicer implementation: {impl} ({source})"


def refuse_unserved(*, tls: bool, metrics_port: int | None, traces: str = "") -> None:
    """ConfigError for what a worker was asked that no engine's Rust lane serves: TLS, a metrics
    port, request spans (``traces``: the flag that asked for them; ``smg`` 1.13's binding takes
    none of them)."""
    if traces:
        raise ConfigError(
            f"{traces} is not served by --servicer-impl rust (the smg binding does not continue "
            "the router's trace)"
        )
    if tls:
        raise ConfigError("TLS (--ssl-*) is not served by --servicer-impl rust")
    if metrics_port is not None:
        raise ConfigError(
            "--metrics-port is not served by --servicer-impl rust (the smg binding exposes no "
            "metrics)"
        )


def binding(class_name: str, install: str, module: str = BINDING) -> Any:
    """The installed ``smg`` wheel's server class (ConfigError, naming ``install``: none)."""
    try:
        return getattr(importlib.import_module(module), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"--servicer-impl rust needs the smg wheel's Rust servicer (smg >= 1.12): {install}"
        ) from exc


def accepted_keywords(server_class: Any) -> frozenset[str]:
    """The keyword arguments the binding's constructor takes, from its text signature."""
    signature = str(getattr(server_class, "__text_signature__", "") or "")
    _, star, keywords = signature.partition("*,")
    return frozenset(re.findall(r"(\w+)\s*=", keywords)) if star else frozenset()


def keep_accepted(wanted: Mapping[str, Any], accepted: frozenset[str]) -> dict[str, Any]:
    """``wanted`` limited to what the installed binding takes; the rest is logged as left out
    (an older or newer wheel: the server is still built, never with a keyword it refuses)."""
    left_out = sorted(set(wanted) - accepted)
    if left_out:
        logger.info("the installed smg binding takes no %s: left out", ", ".join(left_out))
    return {name: value for name, value in wanted.items() if name in accepted}


def free_port() -> int:
    """A free tcp port on 127.0.0.1 (the server's handshake)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_while_starting() -> None:
    """Until the engine's launcher installs its own handlers: SIGTERM/SIGINT end the start with
    exit 0 through ``SystemExit`` (the ``finally`` blocks run: the server stops, its socket folder
    goes, no process is left), instead of the default action's instant death."""

    def stop(signum: int, frame: object) -> None:
        logger.info("signal %d while starting: stopping", signum)
        raise SystemExit(0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


class Lifecycle:
    """SERVING once the engine is connected (polled; the engine's liveness reported to the
    server while it connects), NOT_SERVING at SIGTERM/SIGINT (:meth:`signals`)."""

    def __init__(self, server: Any, alive: Callable[[], bool], engine: str) -> None:
        self.server = server
        self.alive = alive
        self.engine = engine
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._connect, name="smg-rust-ready", daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        while not self.stopping.wait(POLL_S):
            if self.server.engine_ready:
                self.server.set_serving(True)
                logger.info("the %s engine is connected: the Rust servicer is SERVING", self.engine)
                return
            if self.alive():
                self.server.note_engine_alive()

    def drain(self) -> None:
        """A stop was asked: no new request is routed here while the engine drains."""
        self.stopping.set()
        self.server.set_serving(False)

    @contextlib.contextmanager
    def signals(self) -> Generator[None]:
        """While the engine's launcher runs: whatever SIGTERM/SIGINT handler it installs first
        flips health to NOT_SERVING (new requests go elsewhere while the engine drains)."""
        original = signal.signal

        def install(signum: int, handler: Any) -> Any:
            if signum in (signal.SIGTERM, signal.SIGINT) and callable(handler):

                def drain_first(sig: int, frame: Any) -> Any:
                    self.drain()
                    return handler(sig, frame)

                return original(signum, drain_first)
            return original(signum, handler)

        signal.signal = install  # type: ignore[assignment]
        try:
            yield
        finally:
            signal.signal = original
            self.stopping.set()

    def close(self, stop_s: float = STOP_S) -> str:
        """NOT_SERVING, stop the server; the error it stopped on ("" for none, also kept as
        :attr:`error`)."""
        self.stopping.set()
        self.server.set_serving(False)
        self.error = str(self.server.last_error or "")
        self.server.stop(stop_s)
        return self.error

    error = ""


@contextlib.contextmanager
def serving(
    server_class: Any,
    bind: str,
    handshake: str,
    model: str,
    keywords: Mapping[str, Any],
    *,
    engine: str,
    alive: Callable[[], bool],
) -> Generator[Lifecycle]:
    """The Rust server on ``bind`` (its engine sockets in a private folder, removed after) under
    a :class:`Lifecycle`, stopped when the block ends; ConfigError when it cannot serve there (the
    port taken, say). After the block, the error it stopped on is ``lifecycle.error``."""
    sockets = tempfile.mkdtemp(prefix=f"smg-{engine.lower()}-rust-")
    try:
        try:
            server = server_class(bind, f"ipc://{sockets}/engine", handshake, model, **keywords)
        except (OSError, RuntimeError, ValueError, TypeError) as err:
            raise ConfigError(f"the Rust servicer cannot serve on {bind}: {err}") from None
        logger.info("the Rust servicer listens on %s (NOT_SERVING until %s connects)", bind, engine)
        lifecycle = Lifecycle(server, alive, engine)
        try:
            yield lifecycle
        finally:
            if lifecycle.close():
                logger.error("the Rust servicer stopped on an error: %s", lifecycle.error)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def serve_engine(
    server_class: Any,
    bind: str,
    handshake: str,
    model: str,
    keywords: Mapping[str, Any],
    *,
    engine: str,
    alive: Callable[[], bool],
    run: Callable[[], int],
    before: Callable[[], None] | None = None,
) -> int:
    """The Rust lane's recipe once the engine's settings are read, the same for every engine: the
    server on ``bind`` (:func:`serving`), ``before`` (what must be set before the engine starts),
    then ``run()`` (start the engine aimed at ``handshake`` and supervise it: its exit code) under
    the lifecycle's signals; a server that cannot serve there is a configuration error (exit 2,
    one line)."""
    try:
        with serving(
            server_class, bind, handshake, model, keywords, engine=engine, alive=alive
        ) as lifecycle:
            if before is not None:
                before()
            with lifecycle.signals():
                return run()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG


def children_alive() -> bool:
    """Whether this process has a live child (the engine's ranks, for :class:`Lifecycle`)."""
    return bool(multiprocessing.active_children())

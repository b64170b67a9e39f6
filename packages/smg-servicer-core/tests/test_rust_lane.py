"""What every engine's Rust servicer lane shares (core's ``rust_lane``): the setting, the
binding's accepted keywords, and the lifecycle around a server (a stand-in here with the
binding's methods; the real binding: tests-integration/test_rust_lane.py and
test_sglang_rust_lane.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from smg_servicer_core import rust_lane
from smg_servicer_core.config import resolve
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError

pytestmark = pytest.mark.unit

#: A binding as the extension module shows it (its ``__text_signature__``).
_BINDING = SimpleNamespace(
    __text_signature__="(bind_address, ipc_base_url, *, engine_count=1, vocab_size=0, x=...)"
)


def test_the_keywords_are_read_from_the_binding_signature() -> None:
    assert rust_lane.accepted_keywords(_BINDING) == {"engine_count", "vocab_size", "x"}
    assert rust_lane.accepted_keywords(object) == frozenset()


def test_only_accepted_keywords_are_passed_and_the_rest_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    kept = rust_lane.keep_accepted(
        {"vocab_size": 7, "mm_encoder_budget": 0}, frozenset({"vocab_size"})
    )
    assert kept == {"vocab_size": 7}
    assert "takes no mm_encoder_budget: left out" in caplog.text


def test_a_missing_binding_names_the_install_line() -> None:
    with pytest.raises(ConfigError, match=r"pip install x\[rust\]"):
        rust_lane.binding("NoSuchServer", "pip install x[rust]")
    with pytest.raises(ConfigError, match=r"smg >= 1\.12"):
        rust_lane.binding("VllmGrpcServer", "pip install x", module="smg_no_such_module")


def test_the_setting_takes_flag_then_variable_then_python() -> None:
    setting = rust_lane.impl_setting("sglang", "nothing")
    assert setting.env == "SMG_SGLANG_SERVICER_IMPL" and setting.flag == "--servicer-impl"
    env = {"SMG_SGLANG_SERVICER_IMPL": "rust"}
    flag = argparse.Namespace(servicer_impl="python")
    assert resolve((setting,), None, {})["servicer_impl"] == "python"
    from_env = resolve((setting,), None, env)
    assert (from_env["servicer_impl"], from_env.source("servicer_impl")) == ("rust", "env")
    from_flag = resolve((setting,), flag, env)
    assert (from_flag["servicer_impl"], from_flag.source("servicer_impl")) == ("python", "flag")
    with pytest.raises(ConfigError, match="must be one of python, rust"):
        resolve((setting,), None, {"SMG_SGLANG_SERVICER_IMPL": "go"})


def test_the_start_line_says_the_choice_and_its_source() -> None:
    setting = rust_lane.impl_setting("tokenspeed", "nothing")
    chosen = resolve((setting,), None, {"SMG_TOKENSPEED_SERVICER_IMPL": "rust"})
    assert rust_lane.impl_line(chosen) == "servicer implementation: rust (env)"


def test_the_drain_setting_is_per_engine_and_not_negative() -> None:
    drain = rust_lane.drain_setting("sglang")
    assert drain.env == "SMG_SGLANG_DRAIN_TIMEOUT_S"
    assert resolve((drain,), None, {})["drain_timeout_s"] == 30.0
    assert resolve((drain,), None, {"SMG_SGLANG_DRAIN_TIMEOUT_S": "2.5"})["drain_timeout_s"] == 2.5
    with pytest.raises(ConfigError, match="must be >= 0"):
        resolve((drain,), None, {"SMG_SGLANG_DRAIN_TIMEOUT_S": "-1"})


def test_tls_and_a_metrics_port_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^TLS \(--ssl-\*\) is not served"):
        rust_lane.refuse_unserved(tls=True, metrics_port=None)
    with pytest.raises(ConfigError, match=r"--metrics-port is not served .* exposes no metrics"):
        rust_lane.refuse_unserved(tls=False, metrics_port=9100)
    rust_lane.refuse_unserved(tls=False, metrics_port=None)
    with pytest.raises(ConfigError, match=r"^--enable-trace is not served .* continue the router"):
        rust_lane.refuse_unserved(tls=False, metrics_port=None, traces="--enable-trace")


class _Server:
    """The binding's lifecycle methods, recorded."""

    def __init__(self) -> None:
        self.engine_ready = False
        self.serving: list[bool] = []
        self.alive_notes = 0
        self.last_error: str | None = None
        self.stopped: float | None = None
        self.changed = threading.Event()

    def set_serving(self, serving: bool) -> None:
        self.serving.append(serving)
        self.changed.set()

    def note_engine_alive(self) -> None:
        self.alive_notes += 1
        self.changed.set()

    def stop(self, timeout_s: float) -> None:
        self.stopped = timeout_s


def _wait(check: object, server: _Server) -> None:
    for _ in range(100):
        if callable(check) and check():
            return
        server.changed.wait(0.1)
        server.changed.clear()
    raise AssertionError("the lifecycle never got there")


def test_serving_only_once_the_engine_is_connected() -> None:
    server = _Server()
    lifecycle = rust_lane.Lifecycle(server, lambda: True, "Test")
    _wait(lambda: server.alive_notes >= 2, server)
    assert server.serving == []  # engine not connected: NOT_SERVING, its liveness reported
    server.engine_ready = True
    _wait(lambda: server.serving == [True], server)
    server.last_error = "boom"
    assert lifecycle.close(1.5) == "boom"
    assert server.serving == [True, False] and server.stopped == 1.5


def test_a_stop_signal_flips_health_before_the_engines_handler_runs() -> None:
    server = _Server()
    lifecycle = rust_lane.Lifecycle(server, lambda: False, "Test")
    seen: list[list[bool]] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        with lifecycle.signals():
            signal.signal(signal.SIGTERM, lambda sig, frame: seen.append(list(server.serving)))
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler)
            handler(signal.SIGTERM, None)
            # Other signals are installed as given.
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
            assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        assert seen == [[False]]  # NOT_SERVING first, then the engine's own handler
        assert lifecycle.stopping.is_set()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_stop_signal_while_starting_exits_0_through_the_finally_blocks() -> None:
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    cleaned: list[str] = []
    try:
        rust_lane.stop_while_starting()
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and signal.getsignal(signal.SIGINT) is handler
        with pytest.raises(SystemExit) as stopped:
            try:
                handler(signal.SIGTERM, None)
            finally:
                cleaned.append("socket folder")
        assert stopped.value.code == 0 and cleaned == ["socket folder"]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def test_the_server_runs_under_the_lifecycle_and_its_folder_goes() -> None:
    made: list[_Server] = []

    def server_class(
        bind: str, ipc: str, handshake: str, model: str, **keywords: object
    ) -> _Server:
        assert ipc.startswith("ipc://") and keywords == {"vocab_size": 7}
        made.append(_Server())
        return made[-1]

    before = set(Path(tempfile.gettempdir()).glob("smg-test-rust-*"))
    with rust_lane.serving(
        server_class, "h:1", "tcp://h:2", "/m", {"vocab_size": 7}, engine="Test", alive=bool
    ) as lifecycle:
        assert set(Path(tempfile.gettempdir()).glob("smg-test-rust-*")) - before
        made[0].last_error = "engine gone"
    assert lifecycle.error == "engine gone" and made[0].stopped == rust_lane.STOP_S
    assert set(Path(tempfile.gettempdir()).glob("smg-test-rust-*")) == before

    def taken(*args: object, **keywords: object) -> _Server:
        raise OSError("address in use")

    with (
        pytest.raises(ConfigError, match="cannot serve on h:1: address in use"),
        rust_lane.serving(taken, "h:1", "tcp://h:2", "/m", {}, engine="Test", alive=bool),
    ):
        pass
    assert set(Path(tempfile.gettempdir()).glob("smg-test-rust-*")) == before


def test_serve_engine_runs_the_engine_under_the_servers_lifecycle_and_signals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The recipe every engine's Rust lane runs: ``before`` inside the server's lifecycle, then
    the engine's own start and supervision under the lifecycle's signals (SIGTERM flips health
    first); its exit code is the launcher's; a server that cannot serve is exit 2, one line."""
    made: list[_Server] = []
    steps: list[str] = []

    def server_class(bind: str, ipc: str, handshake: str, model: str, **kw: object) -> _Server:
        made.append(_Server())
        return made[-1]

    def run() -> int:  # the engine installs its SIGTERM handler; the lifecycle wraps it
        signal.signal(signal.SIGTERM, lambda sig, frame: steps.append(f"{made[0].serving}"))
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        handler(signal.SIGTERM, None)
        return 7

    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = rust_lane.serve_engine(
            server_class, "h:1", "tcp://h:2", "/m", {}, engine="Test", alive=bool, run=run,
            before=lambda: steps.append("before"),
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (code, steps) == (7, ["before", "[False]"])  # NOT_SERVING, then the engine's
    assert made[0].stopped == rust_lane.STOP_S  # the server stopped after the engine

    def taken(*args: object, **keywords: object) -> _Server:
        raise OSError("address in use")

    code = rust_lane.serve_engine(
        taken, "h:1", "tcp://h:2", "/m", {}, engine="Test", alive=bool, run=lambda: 0
    )
    assert code == ExitCode.CONFIG
    assert "cannot serve on h:1: address in use" in capsys.readouterr().err

"""vLLM general plugin (entry point ``vllm.general_plugins: smg-servicer``): the ``--mm-*`` and
``--metrics-*`` flags on vLLM's gRPC command lines.

vLLM's gRPC launcher parses only ``--host/--port`` and the engine arguments, then builds
``VllmEngineServicer(async_llm, start_time)`` with no settings. vLLM loads its general plugins in
every process; :func:`register` wraps ``FlexibleArgumentParser.parse_known_args`` and nothing
else. The wrapper adds the flags only to a parse that serves gRPC:

- ``vllm serve MODEL --grpc ...``: the parser defines ``--grpc`` and the arguments hold it;
- ``python -m vllm.entrypoints.launchers.grpc_server ...`` (or the pre-0.30 name): ``__main__``
  is the launcher and the parser defines ``--port``.

Any other parse (``vllm serve`` without ``--grpc``, the engine processes, ``vllm bench``) is passed
through untouched. After a gRPC parse every setting is resolved (flag > ``SMG_VLLM_MM_*`` >
default) and validated; a bad value prints one line and exits 2 before the engine is built. The
result is kept for the servicer (:func:`launcher_settings`).

In the launcher process the plugin also:

- makes the gRPC port TLS-only when ``--ssl-certfile``/``--ssl-keyfile`` are given (``vllm
  serve``'s own flags; added to the launcher module's parser, which lacks them) or
  ``SMG_SERVICER_SSL_*`` are set; ``--ssl-ca-certs`` makes client certificates mandatory (mutual
  TLS; vLLM's ``--ssl-cert-reqs`` is an HTTP setting and is not read). The files are read and
  checked at the parse (exit 2 on a bad one); vLLM's own ``add_insecure_port`` then binds a secure
  port instead (:func:`secure_ports`);
- bounds the launcher's stop: from the moment vLLM's launcher starts to shut down (it sets the
  health servicer NOT_SERVING), its 5 s gRPC grace (0.34 with vLLM's ``--shutdown-timeout T``:
  ``max(T, 5) + 10`` s, its drain) plus ``--shutdown-margin``
  (``SMG_SERVICER_SHUTDOWN_MARGIN_S``, 15 s) may pass before the engine's processes are killed
  by PID and the process exits 1 (core's ``shutdown``);
- gives every gRPC server it builds the keepalive options vLLM 0.31+ sets itself
  (:func:`fix_keepalive`): 0.19-0.30 misspell one, and a long non-streaming Generate then died with
  ``GOAWAY too_many_pings`` under the router's keepalive pings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio

from smg_servicer_core.cli import metrics_settings
from smg_servicer_core.config import ResolvedSettings, environment, resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.proto import vllm_engine_pb2_grpc
from smg_servicer_core.rust_lane import describe_impl
from smg_servicer_core.shutdown import SHUTDOWN_MARGIN, ShutdownDeadline
from smg_servicer_core.tls import TLS_SETTINGS, ServerTls, load_server_tls
from smg_servicer_core.wire_guard import tolerant_add
from smg_servicer_vllm import releases, rust_lane
from smg_servicer_vllm.mm_settings import SETTINGS, MmSettings, add_flags, resolve_mm_settings
from smg_servicer_vllm.releases import LAUNCHER_MODULES
from smg_servicer_vllm.rust_lane import SERVICER_IMPL

_MARK = "_smg_servicer_wrapped"
#: Every variable a gRPC parse reads.
SETTINGS_ENV = tuple(
    s.env
    for s in (*SETTINGS, *metrics_settings("vllm"), SHUTDOWN_MARGIN, *TLS_SETTINGS, SERVICER_IMPL)
    if s.env
)
#: vLLM's gRPC launcher stops its server with this grace (``server.stop(grace=5.0)``); 0.34
#: drains longer with ``--shutdown-timeout`` (:func:`.releases.launcher_stop_s`).
VLLM_LAUNCHER_GRACE_S = releases.LAUNCHER_GRACE_S


@dataclass(frozen=True)
class LauncherSettings:
    """What the last gRPC parse of this process resolved."""

    mm: MmSettings
    metrics: ResolvedSettings
    tls: ServerTls | None = None
    shutdown_margin_s: float = SHUTDOWN_MARGIN.default
    #: vLLM's own ``--shutdown-timeout`` (0.34's launcher drains for it)
    shutdown_timeout_s: float = 0.0
    #: ``--servicer-impl`` (:mod:`.rust_lane`) and where it came from
    servicer_impl: str = "python"
    servicer_impl_source: str = "default"

    @property
    def impl_line(self) -> str:
        """What the launcher serves with and where the choice came from (logged at start)."""
        return describe_impl(self.servicer_impl, self.servicer_impl_source)


#: The last gRPC parse's settings (at most one entry: "launch").
_launched: dict[str, LauncherSettings] = {}


def launcher_settings() -> LauncherSettings | None:
    """The settings a gRPC command line of this process gave, or None (no such parse)."""
    return _launched.get("launch")


def servicer_impl_line() -> str:
    """What the launcher serves with and where the choice came from (logged at start)."""
    launch = launcher_settings()
    if launch is None:
        return describe_impl("python", "no launcher command line")
    return launch.impl_line


def in_launcher_process() -> bool:
    """This process is vLLM's gRPC launcher (``python -m vllm.entrypoints.launchers.grpc_server``
    or ``vllm serve M --grpc``) and its command line was parsed: not a process that merely ran
    the parser, such as a test run."""
    if launcher_settings() is None:
        return False
    return _launcher_is_main() or Path(sys.argv[0]).name == "vllm"


def _launcher_is_main() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in LAUNCHER_MODULES


def serves_grpc(parser: argparse.ArgumentParser, argv: Sequence[str]) -> bool:
    options = parser._option_string_actions  # pyright: ignore[reportPrivateUsage]
    if "--grpc" in options:
        return any(a == "--grpc" or a.startswith("--grpc=") for a in argv)
    return "--port" in options and _launcher_is_main()


def add_grpc_flags(parser: argparse.ArgumentParser) -> None:
    """The ``--mm-*`` flags and core's ``--metrics-port/--metrics-host`` (once per parser)."""
    options = parser._option_string_actions  # pyright: ignore[reportPrivateUsage]
    if "--mm-processor" in options:
        return
    add_flags(parser)
    group = parser.add_argument_group("SMG servicer metrics (smg-servicer-vllm)")
    for setting in metrics_settings("vllm"):
        if setting.flag not in options:
            setting.add_to_parser(group)
    SERVICER_IMPL.add_to_parser(parser)
    group = parser.add_argument_group("SMG servicer TLS and shutdown (smg-servicer-vllm)")
    for setting in (SHUTDOWN_MARGIN, *TLS_SETTINGS):
        if setting.flag not in options:  # vllm serve has its own --ssl-* flags: they are read
            setting.add_to_parser(group)


def resolve_launch(namespace: argparse.Namespace) -> LauncherSettings:
    environ = environment()
    impl = resolve((SERVICER_IMPL,), namespace, environ)
    return LauncherSettings(
        servicer_impl=impl[SERVICER_IMPL.name],
        servicer_impl_source=impl.source(SERVICER_IMPL.name),
        mm=resolve_mm_settings(namespace, environ),
        metrics=resolve(metrics_settings("vllm"), namespace, environ),
        tls=load_server_tls(resolve(TLS_SETTINGS, namespace, environ)),
        shutdown_margin_s=resolve((SHUTDOWN_MARGIN,), namespace, environ)[SHUTDOWN_MARGIN.name],
        shutdown_timeout_s=float(getattr(namespace, "shutdown_timeout", 0) or 0),
    )


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    def parse_known_args(
        self: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not serves_grpc(self, argv):
            return original(self, args, namespace)
        add_grpc_flags(self)
        parsed, rest = original(self, args, namespace)
        try:
            _launched["launch"] = resolve_launch(parsed)
        except ConfigError as exc:
            print(f"{self.prog}: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        if getattr(parsed, "mm_redis_url", None) is not None:
            # vLLM's launcher logs its parsed arguments: the URL's repr hides its password.
            parsed.mm_redis_url = _launched["launch"].mm.redis_url
        if in_launcher_process():
            fix_keepalive()
            if _launched["launch"].servicer_impl == "rust":
                rust_lane.take_over(_launched["launch"])
        return parsed, rest

    setattr(parse_known_args, _MARK, True)
    return parse_known_args


#: What vLLM's launcher sets from 0.31 on (vllm#55102). 0.18-0.30 misspell the ping interval
#: (``grpc.http2.min_recv_ping_interval_without_data_ms``, which grpc C-core ignores) and leave the
#: ping strikes at 2: the router's keepalive pings during a long non-streaming Generate then earn
#: ``GOAWAY too_many_pings`` and the call fails.
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)
_KEEPALIVE_MARK = "_smg_keepalive"


def keepalive_options(options: Sequence[tuple[str, Any]] | None) -> list[tuple[str, Any]]:
    """``options`` with every :data:`KEEPALIVE_OPTIONS` entry it lacks (its own values kept)."""
    merged = list(options or ())
    present = {name for name, _ in merged}
    merged.extend(option for option in KEEPALIVE_OPTIONS if option[0] not in present)
    return merged


def fix_keepalive() -> None:
    """In this (launcher) process, every ``grpc.aio.server(...)`` gets :func:`keepalive_options`:
    a no-op on vLLM 0.31+, whose launcher sets them; the fix of the keepalive bug on 0.19-0.30.
    Idempotent."""
    current: Callable[..., Any] = grpc.aio.server
    if getattr(current, _KEEPALIVE_MARK, False):
        return

    def server(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 3:  # (migration_thread_pool, handlers, interceptors, options, ...)
            args = (*args[:3], keepalive_options(args[3]), *args[4:])
        else:
            kwargs["options"] = keepalive_options(kwargs.get("options"))
        return current(*args, **kwargs)

    setattr(server, _KEEPALIVE_MARK, True)
    grpc.aio.server = server


def secure_ports(server: Any, tls: ServerTls) -> None:
    """vLLM's launcher binds with ``server.add_insecure_port(address)``: on this server, that
    call binds a TLS port with ``tls`` instead (every service of the port: the engine's,
    ``grpc.health.v1`` and reflection)."""
    credentials = tls.credentials()

    def add_secure(address: str) -> int:
        return int(server.add_secure_port(address, credentials))

    server.add_insecure_port = add_secure


def shutdown_deadline() -> ShutdownDeadline | None:
    """The launcher's stop deadline (None outside a launcher process); armed by the health
    servicer's ``set_not_serving``, which vLLM's launcher calls when it starts to stop."""
    settings = launcher_settings()
    if settings is None or not in_launcher_process():
        return None
    grace = releases.launcher_stop_s(settings.shutdown_timeout_s)
    return ShutdownDeadline(grace, settings.shutdown_margin_s)


_ADD_MARK = "_smg_launcher_add"


def _launcher_add(add: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    if getattr(add, _ADD_MARK, False):
        return add

    def add_servicer(servicer: Any, server: Any) -> None:
        add(servicer, server)
        settings = launcher_settings()
        if settings is not None and settings.tls is not None and in_launcher_process():
            secure_ports(server, settings.tls)

    setattr(add_servicer, _ADD_MARK, True)
    return add_servicer


def guard_wire() -> None:
    """vLLM's launcher registers our servicer with the generated
    ``add_VllmEngineServicer_to_server`` on a server it builds itself: make that function's
    request parsing tolerant, so bytes that are not a request get INVALID_ARGUMENT from the
    servicer instead of grpcio's UNKNOWN with the parser's text
    (:mod:`smg_servicer_core.wire_guard`), and, in a launcher given TLS files, make the server's
    port secure (:func:`secure_ports`). Idempotent."""
    module: Any = vllm_engine_pb2_grpc
    module.add_VllmEngineServicer_to_server = _launcher_add(
        tolerant_add(module.add_VllmEngineServicer_to_server)
    )


def register() -> None:
    """The entry point vLLM calls (possibly several times per process): wrap the parser once and
    guard the wire (:func:`guard_wire`); in the engine cores of our ZMQ-lane launcher, guard the
    requests the router sends them (:func:`smg_servicer_vllm.headless.guard_engine_core`)."""
    guard_wire()
    if environment().get("SMG_VLLM_ZMQ_LANE") == "1":
        # zmq (core's zmq_lane): only in an engine core of our ZMQ-lane launcher.
        from smg_servicer_vllm.headless import guard_engine_core  # noqa: PLC0415 - zmq

        guard_engine_core()
    try:
        from smg_servicer_vllm import _engine  # noqa: PLC0415 - vLLM (it is calling us)

        parser_class: Any = _engine.argument_parser()
    except ImportError:  # a vLLM without it has no gRPC launcher we serve
        return
    current: Callable[..., Any] = parser_class.parse_known_args
    if getattr(current, _MARK, False):
        return
    parser_class.parse_known_args = _wrap(current)

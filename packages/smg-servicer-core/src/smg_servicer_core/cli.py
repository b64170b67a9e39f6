"""The flags every launcher shares (a parent parser, as KServe does) and their settings.

| flag | variable | default | meaning |
|---|---|---|---|
| ``--host`` | ``SMG_SERVICER_HOST`` | ``0.0.0.0`` | address to bind |
| ``--port`` | ``SMG_SERVICER_PORT`` | ``50051`` | TCP port (0 picks a free one) |
| ``--grace-period`` | ``SMG_SERVICER_GRACE_PERIOD_S`` | ``30`` | drain time after SIGTERM (s) |
| ``--max-message-mb`` | ``SMG_SERVICER_MAX_MESSAGE_MB`` | ``256`` | message size limit (MiB) |
| ``--log-level`` | ``SMG_SERVICER_LOG_LEVEL`` | ``info`` | debug, info, warning, error |
| ``--metrics-port`` | ``SMG_<ENGINE>_SERVICER_METRICS_PORT`` | off | ``/metrics`` port (0: free) |
| ``--metrics-host`` | ``SMG_<ENGINE>_SERVICER_METRICS_HOST`` | ``0.0.0.0`` | ``/metrics`` address |
| ``--otlp-traces-endpoint`` | ``SMG_<ENGINE>_SERVICER_OTLP_TRACES_ENDPOINT`` | off | spans (1) |
| ``--shutdown-margin`` | ``SMG_SERVICER_SHUTDOWN_MARGIN_S`` | ``15`` | stop deadline - grace (s) |
| ``--ssl-*`` | ``SMG_SERVICER_SSL_*`` | off | TLS, mutual TLS (:mod:`smg_servicer_core.tls`) |

(1) request spans continuing the caller's trace, to an OTLP gRPC collector (:mod:`.tracing`).

``<ENGINE>`` is the launcher's engine (``MLX``, ``VLLM``, ``SGLANG``, ``TOKENSPEED``). A metrics
port equal to the gRPC port is a configuration error (exit 2).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from smg_servicer_core.config import ResolvedSettings, Setting, at_least, port_number, resolve
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineMetrics, MetricsServer, ServicerMetrics
from smg_servicer_core.server import (
    EngineLifecycle,
    MiB,
    ServerOptions,
    ServiceBinding,
    serve,
)
from smg_servicer_core.servicer import EngineServicer
from smg_servicer_core.shutdown import SHUTDOWN_MARGIN
from smg_servicer_core.tls import TLS_SETTINGS, ServerTls, load_server_tls
from smg_servicer_core.tracing import Tracing, start_tracing, tracing_setting

logger = logging.getLogger(__name__)

LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(value: str) -> str | None:
    return None if value in LOG_LEVELS else f"must be one of {', '.join(LOG_LEVELS)}"


SERVER_SETTINGS: tuple[Setting[Any], ...] = (
    Setting("host", str, "0.0.0.0", "address to bind", flag="--host", env="SMG_SERVICER_HOST"),
    Setting(
        "port",
        int,
        50051,
        "TCP port to listen on (0 picks a free one)",
        flag="--port",
        env="SMG_SERVICER_PORT",
        validate=port_number,
    ),
    Setting(
        "grace_period_s",
        float,
        30.0,
        "seconds in-flight calls may drain after SIGTERM",
        flag="--grace-period",
        env="SMG_SERVICER_GRACE_PERIOD_S",
        validate=at_least(0.0),
    ),
    Setting(
        "max_message_mb",
        int,
        256,
        "gRPC message size limit in MiB",
        flag="--max-message-mb",
        env="SMG_SERVICER_MAX_MESSAGE_MB",
        validate=at_least(1),
    ),
    Setting(
        "log_level",
        str.lower,
        "info",
        "log level",
        flag="--log-level",
        env="SMG_SERVICER_LOG_LEVEL",
        validate=_log_level,
    ),
    SHUTDOWN_MARGIN,
    *TLS_SETTINGS,
)


def _metrics_port(value: int | None) -> str | None:
    return None if value is None else port_number(value)


def metrics_settings(engine: str) -> tuple[Setting[Any], ...]:
    """``--metrics-port`` / ``--metrics-host`` with ``SMG_<ENGINE>_SERVICER_METRICS_*``."""
    prefix = f"SMG_{engine.upper()}_SERVICER_METRICS"
    return (
        Setting(
            "metrics_port",
            int,
            None,
            "serve Prometheus /metrics on this port (off when unset; 0 picks a free one)",
            flag="--metrics-port",
            env=f"{prefix}_PORT",
            validate=_metrics_port,
        ),
        Setting(
            "metrics_host",
            str,
            "0.0.0.0",
            "address /metrics binds",
            flag="--metrics-host",
            env=f"{prefix}_HOST",
        ),
    )


def server_settings(engine: str | None = None) -> tuple[Setting[Any], ...]:
    if not engine:
        return SERVER_SETTINGS
    return (*SERVER_SETTINGS, *metrics_settings(engine), tracing_setting(engine))


def server_parser(engine: str | None = None) -> argparse.ArgumentParser:
    """A parent parser (``add_help=False``) with the shared server flags (and the metrics and
    tracing flags when ``engine`` names the launcher's engine)."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("server")
    for setting in server_settings(engine):
        setting.add_to_parser(group)
    return parser


def resolve_server(
    namespace: argparse.Namespace | None, environ: Mapping[str, str], engine: str | None = None
) -> ResolvedSettings:
    resolved = resolve(server_settings(engine), namespace, environ)
    check_metrics_port(resolved, resolved["port"])
    return resolved


def check_metrics_port(resolved: ResolvedSettings, grpc_port: int) -> None:
    """A metrics port that is the gRPC port cannot work: refuse it at start (exit 2)."""
    if "metrics_port" not in resolved:
        return
    port = resolved["metrics_port"]
    if port is not None and port != 0 and port == grpc_port:
        raise ConfigError(f"--metrics-port {port} is the gRPC port; choose another")


def start_metrics(
    resolved: ResolvedSettings,
    engine: EngineMetrics | None = None,
    tls: ServerTls | None = None,
) -> tuple[ServicerMetrics, MetricsServer] | None:
    """The metrics and their ``/metrics`` server when ``--metrics-port`` is set, else None
    (and no port is opened). ``engine``: the engine's own metrics, served beside ours; ``tls``:
    the gRPC port's, which ``/metrics`` then has too (HTTPS, the same client CA)."""
    if "metrics_port" not in resolved or resolved["metrics_port"] is None:
        return None
    metrics = ServicerMetrics()
    host, port = resolved["metrics_host"], resolved["metrics_port"]
    return metrics, MetricsServer(metrics, host, port, engine, tls)


def tracing_from(resolved: ResolvedSettings, service_name: str) -> Tracing | None:
    """Request spans when ``--otlp-traces-endpoint`` is set, else None (a missing SDK: exit 2)."""
    return start_tracing(resolved.get("otlp_traces_endpoint", ""), service_name)


def server_options(resolved: ResolvedSettings, tls: ServerTls | None = None) -> ServerOptions:
    """The options of a launcher that owns every server flag; ``tls`` as
    :func:`~smg_servicer_core.tls.load_server_tls` gave it (read the files before the engine
    starts, so a bad one exits 2 at once)."""
    return ServerOptions(
        host=resolved["host"],
        port=resolved["port"],
        grace_period_s=resolved["grace_period_s"],
        max_message_bytes=resolved["max_message_mb"] * MiB,
        tls=tls if tls is not None else load_server_tls(resolved),
        shutdown_margin_s=resolved["shutdown_margin_s"],
    )


def own_flags_parser(
    prog: str, settings: Sequence[Setting[Any]], engine: str
) -> argparse.ArgumentParser:
    """The parser of a launcher's own flags (``add_help=False``), which come before the engine's."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", add_help=False)
    group = parser.add_argument_group(f"servicer (before the {engine} flags)")
    for setting in settings:
        setting.add_to_parser(group)
    return parser


def split_launcher_args(
    parser: argparse.ArgumentParser, argv: Sequence[str], engine: str
) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's own flags and the rest (the engine's). With ``--help``, the own flags' help
    is printed first and the engine's parser prints its own after it."""
    own, rest = parser.parse_known_args(list(argv))
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print(f"\n{engine} server flags:")
    return own, rest


async def serve_servicer(
    servicer: EngineServicer,
    bindings: Sequence[ServiceBinding],
    health: HealthFrame,
    engine: EngineLifecycle,
    options: ServerOptions,
    *,
    resolved: ResolvedSettings,
    on_started: Callable[[int], None] | None = None,
    tracing: Tracing | None = None,
    engine_metrics: EngineMetrics | None = None,
) -> int:
    """``serve()`` for a launcher: ``/metrics`` when ``--metrics-port`` is set (the servicer
    reports to it; ``engine_metrics``: the engine's own, served beside), request spans with
    ``tracing`` (the launcher starts it before its engine: :func:`tracing_from`), the drain
    ending as soon as the servicer's registry is empty. A port that cannot be bound gives exit 2,
    any other failure exit 1, the engine shut down either way."""
    try:
        servicer.attach_tracing(tracing)
        metrics = start_metrics(resolved, engine_metrics, tls=options.tls)
        if metrics is not None:
            servicer.attach_metrics(metrics[0])
        return await serve(
            bindings,
            health,
            engine,
            options,
            on_started=on_started,
            in_flight=lambda: len(servicer.registry),
            metrics_server=metrics[1] if metrics else None,
        )
    except ConfigError as exc:  # the port cannot be bound
        logger.error("%s", exc)
        await engine.shutdown()
        return ExitCode.CONFIG
    except Exception:
        logger.exception("server failed")
        await engine.shutdown()
        return ExitCode.ENGINE_DIED

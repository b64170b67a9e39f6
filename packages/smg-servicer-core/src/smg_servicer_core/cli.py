"""The flags every launcher shares (a parent parser, as KServe does) and their settings.

| flag | variable | default | meaning |
|---|---|---|---|
| ``--host`` | ``SMG_SERVICER_HOST`` | ``0.0.0.0`` | address to bind |
| ``--port`` | ``SMG_SERVICER_PORT`` | ``50051`` | TCP port (0 picks a free one) |
| ``--grace-period`` | ``SMG_SERVICER_GRACE_PERIOD_S`` | ``30`` | drain time after SIGTERM (s) |
| ``--max-message-mb`` | ``SMG_SERVICER_MAX_MESSAGE_MB`` | ``256`` | message size limit (MiB) |
| ``--log-level`` | ``SMG_SERVICER_LOG_LEVEL`` | ``info`` | debug, info, warning, error |
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from smg_servicer_core.config import ResolvedSettings, Setting, at_least, port_number, resolve
from smg_servicer_core.server import MiB, ServerOptions

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
)


def server_parser() -> argparse.ArgumentParser:
    """A parent parser (``add_help=False``) with the shared server flags."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("server")
    for setting in SERVER_SETTINGS:
        setting.add_to_parser(group)
    return parser


def resolve_server(namespace: argparse.Namespace, environ: Mapping[str, str]) -> ResolvedSettings:
    return resolve(SERVER_SETTINGS, namespace, environ)


def server_options(resolved: ResolvedSettings) -> ServerOptions:
    return ServerOptions(
        host=resolved["host"],
        port=resolved["port"],
        grace_period_s=resolved["grace_period_s"],
        max_message_bytes=resolved["max_message_mb"] * MiB,
    )

"""The servicer's own settings (TokenSpeed owns host, port, model and logging), readable without
importing TokenSpeed, so ``python -m smg_servicer_tokenspeed`` refuses a bad one at once.

| flag | variable | default | meaning |
|---|---|---|---|
| ``--grace-period`` | ``SMG_SERVICER_GRACE_PERIOD_S`` | ``30`` | drain time after SIGTERM (s) |
| ``--metrics-port`` | ``SMG_TOKENSPEED_SERVICER_METRICS_PORT`` | off | ``/metrics`` port |
| ``--metrics-host`` | ``SMG_TOKENSPEED_SERVICER_METRICS_HOST`` | ``0.0.0.0`` | its address |
| ``--shutdown-margin`` | ``SMG_SERVICER_SHUTDOWN_MARGIN_S`` | ``15`` | stop deadline - grace (s) |
| ``--ssl-certfile`` | ``SMG_SERVICER_SSL_CERTFILE`` | off | TLS with ``--ssl-keyfile`` |
| ``--ssl-keyfile`` | ``SMG_SERVICER_SSL_KEYFILE`` | off | the certificate's key |
| ``--ssl-ca-certs`` | ``SMG_SERVICER_SSL_CA_CERTS`` | off | require client certificates |
| ``--ssl-keyfile-password`` | ``SMG_SERVICER_SSL_KEYFILE_PASSWORD`` | | an encrypted key's |
| | ``TOKENSPEED_GRPC_MAX_MESSAGE_BYTES`` | 256 MiB | gRPC message size limit |
| | ``SMG_TOKENSPEED_SERVICER_WARMUP`` | on | one warm-up request before SERVING |
| | ``TOKENSPEED_SKIP_GRPC_WARMUP`` | off | TokenSpeed's name for skipping it |
| | ``TOKENSPEED_HEALTH_CHECK_TIMEOUT`` | ``20`` | the deep ``HealthCheck`` probe's wait (s) |
| | ``TOKENSPEED_PAUSE_PROBE_TIMEOUT`` | ``2`` | ``GetServerInfo``'s pause-state wait (s) |
| | ``SMG_PAIRING_PROTOCOL`` | | advertised PD pairing protocol |
| | ``SMG_TOKENSPEED_SCHEDULER`` | | ``module:function`` replacing the scheduler (tests) |
| ``--servicer-impl`` | ``SMG_TOKENSPEED_SERVICER_IMPL`` | ``python`` | ``rust``: the Rust server |
| | ``SMG_TOKENSPEED_DRAIN_TIMEOUT_S`` | ``30`` | the Rust lane's drain after SIGTERM (s) |
"""

from __future__ import annotations

from typing import Any

from smg_servicer_core import rust_lane
from smg_servicer_core.cli import SERVER_SETTINGS, metrics_settings
from smg_servicer_core.config import ResolvedSettings, Setting, environment, parse_bool, resolve
from smg_servicer_core.config import setting_value as value_of
from smg_servicer_core.server import MiB
from smg_servicer_core.shutdown import SHUTDOWN_MARGIN
from smg_servicer_core.tls import TLS_SETTINGS
from smg_servicer_core.tracing import tracing_setting

WARMUP = Setting(
    "warmup",
    parse_bool,
    True,
    "one warm-up request before SERVING",
    env="SMG_TOKENSPEED_SERVICER_WARMUP",
)
SKIP_WARMUP = Setting(
    "skip_warmup", parse_bool, False, "skip the warm-up (TokenSpeed's name)",
    env="TOKENSPEED_SKIP_GRPC_WARMUP",
)  # fmt: skip
MAX_MESSAGE_BYTES = Setting(
    "max_message_bytes",
    int,
    256 * MiB,
    "gRPC message size limit in bytes",
    env="TOKENSPEED_GRPC_MAX_MESSAGE_BYTES",
    validate=lambda v: None if 1 <= v <= 2**31 - 1 else "must be in [1, 2147483647]",
)
HEALTH_TIMEOUT = Setting(
    "health_timeout_s",
    float,
    20.0,
    "seconds the deep HealthCheck probe waits for the scheduler",
    env="TOKENSPEED_HEALTH_CHECK_TIMEOUT",
)
PAUSE_PROBE_TIMEOUT = Setting(
    "pause_probe_timeout_s",
    float,
    2.0,
    "seconds GetServerInfo waits for the scheduler's pause state",
    env="TOKENSPEED_PAUSE_PROBE_TIMEOUT",
)
SERVICER_IMPL = rust_lane.impl_setting(
    "tokenspeed",
    "no --metrics-port, TLS, attention data parallelism or prefill/decode/encode roles there",
)
DRAIN = rust_lane.drain_setting("tokenspeed")
PAIRING_PROTOCOL = Setting(
    "pairing_protocol", str.strip, "", "advertised PD pairing protocol", env="SMG_PAIRING_PROTOCOL"
)


def servicer_settings() -> tuple[Setting[Any], ...]:
    """The servicer's own settings (TokenSpeed owns host, port, model and logging): the grace
    period and shutdown margin, the metrics flags, ``--otlp-traces-endpoint`` (request spans), the
    message-size limit, TLS (TokenSpeed
    has no TLS flags of its own) and the implementation (``--servicer-impl``, with the Rust
    lane's drain)."""
    grace = next(s for s in SERVER_SETTINGS if s.name == "grace_period_s")
    return (
        grace,
        SHUTDOWN_MARGIN,
        *metrics_settings("tokenspeed"),
        tracing_setting("tokenspeed"),
        MAX_MESSAGE_BYTES,
        *TLS_SETTINGS,
        SERVICER_IMPL,
        DRAIN,
    )


def resolve_settings(namespace: Any = None) -> ResolvedSettings:
    return resolve(servicer_settings(), namespace, environment())


def warmup_wanted() -> bool:
    return bool(value_of(WARMUP)) and not value_of(SKIP_WARMUP)

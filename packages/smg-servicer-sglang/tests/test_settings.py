"""The servicer's own settings on SGLang: the shared grace period and the metrics flags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from smg_servicer_core.config import resolve
from smg_servicer_sglang.__main__ import own_parser
from smg_servicer_sglang.server import resolve_settings, run, servicer_settings

pytestmark = pytest.mark.unit


def test_own_flags_come_first_and_the_rest_goes_to_sglang() -> None:
    own, rest = own_parser().parse_known_args(
        ["--grace-period", "5", "--metrics-port", "9100", "--model-path", "m", "--port", "1"]
    )
    settings = resolve_settings(own)
    assert (settings["grace_period_s"], settings.source("grace_period_s")) == (5.0, "flag")
    assert (settings["metrics_port"], settings.source("metrics_port")) == (9100, "flag")
    assert rest == ["--model-path", "m", "--port", "1"]


def test_variables_when_sglang_serve_launches_us(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_SERVICER_GRACE_PERIOD_S", "7")
    monkeypatch.setenv("SMG_SGLANG_SERVICER_METRICS_PORT", "9101")
    settings = resolve_settings()
    assert settings["grace_period_s"] == 7.0
    assert settings.source("metrics_port") == "env"
    monkeypatch.delenv("SMG_SGLANG_SERVICER_METRICS_PORT")
    assert resolve_settings()["metrics_port"] is None  # off by default


async def test_a_metrics_port_equal_to_the_grpc_port_exits_2() -> None:
    settings = resolve(servicer_settings(), None, {"SMG_SGLANG_SERVICER_METRICS_PORT": "7000"})
    assert await run(SimpleNamespace(port=7000), settings=settings) == 2

from __future__ import annotations

import argparse
import logging

import pytest

from smg_servicer_core.cli import resolve_server, server_options, server_parser
from smg_servicer_core.config import Setting, parse_bool, resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.loads import LoadTracker


def _parse(*argv: str) -> argparse.Namespace:
    return argparse.ArgumentParser(parents=[server_parser()]).parse_args(list(argv))


@pytest.mark.unit
def test_flag_beats_env_beats_default() -> None:
    env = {"SMG_SERVICER_PORT": "6000", "SMG_SERVICER_GRACE_PERIOD_S": "3"}
    resolved = resolve_server(_parse("--port", "7000"), env)
    assert (resolved["port"], resolved.source("port")) == (7000, "flag")
    assert (resolved["grace_period_s"], resolved.source("grace_period_s")) == (3.0, "env")
    assert (resolved["host"], resolved.source("host")) == ("0.0.0.0", "default")
    assert "port=7000 (flag)" in resolved.describe()
    options = server_options(resolved)
    assert options.max_message_bytes == 256 * 1024 * 1024


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (("--port", "abc"), {}, "--port"),
        ((), {"SMG_SERVICER_PORT": "-1"}, "SMG_SERVICER_PORT"),
        (("--max-message-mb", "0"), {}, "--max-message-mb"),
    ],
)
def test_bad_values_raise_config_error_naming_the_source(argv, env, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        resolve_server(_parse(*argv), env)


@pytest.mark.unit
def test_deprecated_env_fallback_logs_a_line(caplog) -> None:
    setting = Setting(
        "mode", str, "off", "mode", flag="--mode", env="OLD_MODE", env_deprecated=True
    )
    caplog.set_level(logging.WARNING)
    resolved = resolve([setting], argparse.Namespace(mode=None), {"OLD_MODE": "on"})
    assert resolved.source("mode") == "env"
    assert any(
        "OLD_MODE is deprecated" in r.getMessage() and "--mode" in r.getMessage()
        for r in caplog.records
    )
    caplog.clear()
    resolve([setting], argparse.Namespace(mode="x"), {"OLD_MODE": "on"})
    assert not caplog.records, "a flag given means the variable is not used, so no warning"


@pytest.mark.unit
def test_parse_bool() -> None:
    assert parse_bool("Yes") is True and parse_bool("off") is False
    with pytest.raises(ValueError, match="expected"):
        parse_bool("maybe")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.unit
def test_throughput_window_slides() -> None:
    clock = FakeClock()
    tracker = LoadTracker(window_s=2.0, bucket_s=0.1, clock=clock)
    tracker.record_tokens(100)
    clock.now += 1.0
    tracker.record_tokens(300)
    assert tracker.snapshot().gen_throughput == pytest.approx(200.0)
    clock.now += 1.5  # the first 100 tokens left the window
    assert tracker.snapshot().gen_throughput == pytest.approx(150.0)
    clock.now += 5
    assert tracker.snapshot().gen_throughput == 0.0


@pytest.mark.unit
def test_hit_rate_over_last_samples() -> None:
    tracker = LoadTracker(hit_rate_samples=2)
    tracker.record_prompt(100, 0)
    tracker.record_prompt(100, 50)
    tracker.record_prompt(100, 100)  # pushes out the first sample
    assert tracker.snapshot().cache_hit_rate == pytest.approx(0.75)


@pytest.mark.unit
def test_bucket_memory_is_bounded() -> None:
    clock = FakeClock()
    tracker = LoadTracker(window_s=2.0, bucket_s=0.05, clock=clock)
    for _ in range(10_000):
        clock.now += 0.01
        tracker.record_tokens(1)
    assert len(tracker._buckets) <= 41

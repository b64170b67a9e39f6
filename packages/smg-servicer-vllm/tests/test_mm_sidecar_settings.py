"""The sidecar resolves the Redis URL and the namespace exactly as the worker does."""

from __future__ import annotations

import argparse

import pytest

from smg_servicer_core.config import resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_vllm.mm_settings import resolve_mm_settings
from smg_servicer_vllm.mm_sidecar.settings import SETTINGS

pytestmark = pytest.mark.unit

ENV = {
    "SMG_VLLM_MM_REDIS_URL": "redis://:pw@10.0.0.2:6380/3",
    "SMG_VLLM_MM_SIDECAR_NAMESPACE": "  team-a ",
}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for setting in SETTINGS:
        setting.add_to_parser(parser)
    return parser.parse_args(list(argv))


def test_the_variables_give_both_processes_the_same_values() -> None:
    sidecar = resolve(SETTINGS, parse(), ENV)
    worker = resolve_mm_settings(None, ENV)
    assert sidecar["redis_url"] == worker.redis_url == "redis://:pw@10.0.0.2:6380/3"
    assert sidecar["namespace"] == worker.sidecar_namespace == "team-a"
    assert (sidecar.source("redis_url"), sidecar.source("namespace")) == ("env", "env")


def test_flags_win_and_defaults_hold() -> None:
    sidecar = resolve(SETTINGS, parse("--redis-url", "redis://h:1/0", "--namespace", "x"), ENV)
    assert (sidecar["redis_url"], sidecar["namespace"]) == ("redis://h:1/0", "x")
    plain = resolve(SETTINGS, parse(), {})
    assert plain["namespace"] is None and plain["concurrency"] == 2
    assert plain["max_result_bytes"] == 512 << 20


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (("--concurrency", "0"), {}),
        (("--redis-url", "http://h/0"), {}),
        (("--namespace", "a b"), {}),
        ((), {"SMG_VLLM_MM_MAX_RESULT_BYTES": "-1"}),
    ],
)
def test_a_bad_value_is_a_config_error(argv: tuple[str, ...], env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        resolve(SETTINGS, parse(*argv), env)

"""The Rust lane's choices before anything starts: the binding's keywords, the pre-flight hook
``smg serve --servicer-impl rust`` calls, what the lane refuses, the headless command line it
derives from the launcher's (the lane itself: tests-integration/test_rust_lane.py)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from smg_servicer_core.config import Resolved, ResolvedSettings
from smg_servicer_core.errors import ConfigError
from smg_servicer_vllm import headless, rust_lane
from smg_servicer_vllm.mm_settings import MmSettings
from smg_servicer_vllm.plugin import LauncherSettings

pytestmark = pytest.mark.unit


def test_the_installed_binding_takes_what_smg_1_13_takes() -> None:
    accepted = rust_lane.accepted_keywords(rust_lane.binding())
    assert {"tokenizer_dir", "max_context_length", "engine_count", "log_stats"} <= accepted
    # What the replaced implementation passed and smg 1.13 refuses (its TypeError at start).
    assert not accepted & {"engine_silence_timeout_secs", "metrics_bind_address"}


def test_the_preflight_hook_passes_here_and_names_the_fix_without_the_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rust_lane.require_upstream_hook()
    monkeypatch.setattr(rust_lane, "BINDING", "smg_no_such_binding")
    with pytest.raises(RuntimeError, match=r"pip install 'smg-servicer-vllm\[rust\]'"):
        rust_lane.require_upstream_hook()


def _settings(**changes: Any) -> LauncherSettings:
    port = Resolved(changes.pop("metrics_port", None), "flag")
    fields = {"mm": MmSettings(), "metrics": ResolvedSettings({"metrics_port": port})}
    return LauncherSettings(**(fields | changes))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (_settings(metrics_port=9100), "--metrics-port is not served"),
        (_settings(mm=MmSettings(processor="inprocess", source="flag")), "--mm-processor"),
        (_settings(tls=object()), "TLS"),
    ],
    ids=["metrics", "media", "tls"],
)
def test_what_the_lane_cannot_serve_is_a_configuration_error(
    settings: LauncherSettings, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        rust_lane.refuse_unserved(settings)


def test_a_plain_launch_is_served() -> None:
    rust_lane.refuse_unserved(_settings())
    rust_lane.refuse_unserved(None)


def test_the_headless_command_line_takes_the_launchers_engine_values() -> None:
    launch = argparse.Namespace(
        model="/m", host="127.0.0.1", port=7, max_model_len=512, dtype="float32", bogus=1
    )
    args = rust_lane.headless_args(launch, ["--model", "/m", "--max-model-len", "512"])
    assert (args.model, args.max_model_len, args.dtype, args.headless) == ("/m", 512, "float32", 1)
    assert not hasattr(args, "bogus")
    assert args.shutdown_timeout == headless.DRAIN_S  # vLLM's 0 would abort what is in flight
    launch.shutdown_timeout = 5
    given = rust_lane.headless_args(launch, ["--shutdown-timeout", "5"])
    assert given.shutdown_timeout == 5

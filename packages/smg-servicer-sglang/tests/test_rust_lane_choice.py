"""The SGLang Rust lane's choices before anything starts: the flag and the variable, what the lane
refuses, the keywords the binding is built with (the lane itself:
tests-integration/test_sglang_rust_lane.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from smg_servicer_core import rust_lane as core_lane
from smg_servicer_core.config import Resolved, ResolvedSettings
from smg_servicer_core.errors import ConfigError
from smg_servicer_sglang import rust_lane
from smg_servicer_sglang.__main__ import own_parser
from smg_servicer_sglang.server import resolve_settings

pytestmark = pytest.mark.unit


def _own(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> ResolvedSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    namespace, _ = own_parser().parse_known_args(argv)
    return resolve_settings(namespace)


def test_the_flag_beats_the_variable_which_beats_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMG_SGLANG_SERVICER_IMPL", raising=False)
    assert rust_lane.impl_line(_own([], monkeypatch)) == "servicer implementation: python (default)"
    from_env = _own([], monkeypatch, SMG_SGLANG_SERVICER_IMPL="rust")
    assert rust_lane.impl_line(from_env) == "servicer implementation: rust (env)"
    from_flag = _own(["--servicer-impl", "python"], monkeypatch, SMG_SGLANG_SERVICER_IMPL="rust")
    assert rust_lane.impl_line(from_flag) == "servicer implementation: python (flag)"
    with pytest.raises(ConfigError, match="must be one of python, rust"):
        _own(["--servicer-impl", "go"], monkeypatch)


def _settings(metrics_port: int | None = None) -> ResolvedSettings:
    return ResolvedSettings({"metrics_port": Resolved(metrics_port, "flag")})


@pytest.mark.parametrize(
    ("args", "settings", "env", "message"),
    [
        ({}, _settings(9100), {}, "--metrics-port is not served"),
        ({"ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}, _settings(), {}, "TLS"),
        ({}, _settings(), {"SMG_SERVICER_SSL_CA_CERTS": "/ca.pem"}, "TLS"),
        ({"enable_trace": True}, _settings(), {}, "--enable-trace is not served"),
    ],
    ids=["metrics", "tls-flags", "tls-env", "traces"],
)
def test_what_the_lane_cannot_serve_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
    args: dict[str, Any],
    settings: ResolvedSettings,
    env: dict[str, str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        rust_lane.refuse_unserved(SimpleNamespace(**args), settings)


def test_a_plain_launch_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CERTFILE", "KEYFILE", "CA_CERTS", "KEYFILE_PASSWORD"):
        monkeypatch.delenv(f"SMG_SERVICER_SSL_{name}", raising=False)
    rust_lane.refuse_unserved(SimpleNamespace(ssl_certfile=None), _settings())


def test_the_installed_binding_takes_every_fact_we_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With smg 1.13, nothing of the model's or the engine's facts is left out."""
    caplog.set_level(logging.INFO)
    config = SimpleNamespace(
        model_path="/m",
        tokenizer_path="/m",
        preferred_sampling_params=None,
        weight_version=None,
        served_model_name="served",
        max_running_requests=8,
        context_length=1024,
    )
    facts = {
        "vocab_size": 4096, "context_length": 1024, "is_generation": True,
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "eos_token_ids": [2],
        "pad_token_id": 3, "bos_token_id": 0, "num_labels": 0, "id2label": {},
    }  # fmt: skip
    server_args = SimpleNamespace(__struct_fields__=("context_length",))
    accepted = core_lane.accepted_keywords(rust_lane.binding())
    keywords = rust_lane.server_keywords(server_args, config, facts, accepted)
    assert "left out" not in caplog.text
    assert keywords["served_model_name"] == "served" and keywords["vocab_size"] == 4096
    assert keywords["max_context_length"] == 1024 and keywords["max_running_requests"] == 8
    assert keywords["server_args_json"] == '{"context_length": 1024}'
    assert keywords["supports_vision"] is False


def test_the_rust_lane_says_it_takes_no_images_even_for_a_vision_model() -> None:
    """The binding's image path is untested here: the lane reports no vision whatever the model
    (the Python lane reports it from the model: test_images)."""
    from smg_servicer_sglang.images import ImageRules

    config = SimpleNamespace(
        model_path="/m", tokenizer_path="/m", preferred_sampling_params=None,
        weight_version=None, served_model_name="m", max_running_requests=8, context_length=1024,
    )  # fmt: skip
    rules = ImageRules("gemma3", 4098, 4096, 4097, 4, 56)
    facts = {
        "vocab_size": 4160, "context_length": 1024, "is_generation": True,
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "eos_token_ids": [2], "pad_token_id": 3, "bos_token_id": 0, "num_labels": 0,
        "id2label": {}, "image_rules": rules,
    }  # fmt: skip
    server_args = SimpleNamespace(__struct_fields__=("context_length",))
    keywords = rust_lane.server_keywords(server_args, config, facts, frozenset({"supports_vision"}))
    assert keywords == {"supports_vision": False}

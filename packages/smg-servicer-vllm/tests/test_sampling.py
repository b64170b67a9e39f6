"""Proto SamplingParams -> vLLM keyword arguments (pure; no engine)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm.sampling import kv_transfer_params, to_sampling_spec

pytestmark = pytest.mark.unit


def test_proto3_unset_rules() -> None:
    spec = to_sampling_spec(pb.SamplingParams())
    kw = spec.kwargs
    assert (kw["temperature"], kw["top_p"], kw["repetition_penalty"], kw["n"]) == (1.0, 1.0, 1.0, 1)
    assert kw["max_tokens"] is None and kw["logprobs"] is None and kw["seed"] is None
    assert kw["stop"] is None and kw["logit_bias"] is None and kw["detokenize"] is False
    assert spec.structured is None and spec.tokenization is None


def test_set_values_pass_through() -> None:
    sp = pb.SamplingParams(
        temperature=0.0,
        top_p=0.5,
        top_k=7,
        max_tokens=9,
        n=2,
        seed=3,
        logprobs=4,
        prompt_logprobs=1,
        stop=["\\n"],
        stop_token_ids=[5],
        logit_bias={10: 2.0},
        truncate_prompt_tokens=100,
        ignore_eos=True,
    )
    spec = to_sampling_spec(sp)
    kw = spec.kwargs
    assert kw["temperature"] == 0.0 and kw["top_p"] == 0.5 and kw["top_k"] == 7
    assert (kw["max_tokens"], kw["n"], kw["seed"], kw["logprobs"]) == (9, 2, 3, 4)
    assert kw["stop"] == ["\\n"] and kw["stop_token_ids"] == [5] and kw["detokenize"] is True
    assert kw["logit_bias"] == {10: 2.0} and kw["ignore_eos"] is True
    assert spec.tokenization == {"truncate_prompt_tokens": 100}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("json_schema", json.dumps({"type": "object"}), {"json": {"type": "object"}}),
        ("regex", "[a-z]+", {"regex": "[a-z]+"}),
        ("grammar", "root ::= 'a'", {"grammar": "root ::= 'a'"}),
        ("structural_tag", '{"x": 1}', {"structural_tag": '{"x": 1}'}),
        ("json_object", True, {"json_object": True}),
    ],
)
def test_constraints(field: str, value: Any, expected: dict) -> None:
    assert to_sampling_spec(pb.SamplingParams(**{field: value})).structured == expected


def test_choice_constraint() -> None:
    sp = pb.SamplingParams(choice=pb.ChoiceConstraint(choices=["yes", "no"]))
    assert to_sampling_spec(sp).structured == {"choice": ["yes", "no"]}


@pytest.mark.parametrize(
    "sp",
    [
        pb.SamplingParams(temperature=-0.1),
        pb.SamplingParams(top_p=1.01),
        pb.SamplingParams(min_p=2.0),
        pb.SamplingParams(frequency_penalty=3.0),
        pb.SamplingParams(max_tokens=0),
        pb.SamplingParams(n=1000),
        pb.SamplingParams(logprobs=50),
        pb.SamplingParams(logit_bias={1: 500.0}),
        pb.SamplingParams(temperature=float("nan")),
        pb.SamplingParams(json_schema="{oops"),
        pb.SamplingParams(json_schema="[1, 2]"),
        pb.SamplingParams(choice=pb.ChoiceConstraint()),
        pb.SamplingParams(regex=""),
    ],
)
def test_invalid_values(sp: pb.SamplingParams) -> None:
    with pytest.raises(InvalidRequest):
        to_sampling_spec(sp)


def test_kv_transfer_params_json_wins_and_is_validated() -> None:
    both = pb.GenerateRequest(
        kv_transfer_params_json='{"do_remote_prefill": true}',
        kv_transfer_params=pb.KvTransferParams(remote_host="h", remote_port=1),
    )
    assert kv_transfer_params(both) == {"do_remote_prefill": True}
    legacy = pb.GenerateRequest(
        kv_transfer_params=pb.KvTransferParams(remote_host="h", remote_port=7000)
    )
    assert kv_transfer_params(legacy) == {"remote_host": "h", "remote_port": 7000}
    assert kv_transfer_params(pb.GenerateRequest()) is None
    for bad in ("[1]", "{nope"):
        with pytest.raises(InvalidRequest):
            kv_transfer_params(pb.GenerateRequest(kv_transfer_params_json=bad))
    with pytest.raises(InvalidRequest):
        kv_transfer_params(
            pb.GenerateRequest(
                kv_transfer_params=pb.KvTransferParams(remote_host="h", remote_port=70000)
            )
        )

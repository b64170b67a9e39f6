"""The pieces every engine servicer is built from: validators, model facts, watchdog, lint rule."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
import pytest
from smg_grpc_proto.generated import mlx_engine_pb2, sglang_scheduler_pb2, vllm_engine_pb2

from smg_it.paths import REPO
from smg_servicer_core import validate
from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.testing.bad_requests import BAD_REQUESTS
from smg_servicer_core.watchdog import Watchdog, child_exited


def _message(call: object) -> str:
    with pytest.raises(InvalidRequest) as err:
        call()  # type: ignore[operator]
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return err.value.message


@pytest.mark.unit
def test_each_rule_has_its_message() -> None:
    assert _message(lambda: validate.prompt([], 10, 8)) == "the prompt is empty"
    assert _message(lambda: validate.prompt([1, 10], 10, 8)) == (
        "token id 10 is outside the vocabulary (size 10)"
    )
    assert _message(lambda: validate.prompt([1] * 8, 10, 8)) == (
        "the prompt has 8 tokens; the context holds 8"
    )
    assert _message(lambda: validate.max_tokens(0)) == "max_tokens must be at least 1, got 0"
    s = validate.Sampling
    assert _message(lambda: validate.sampling(s(temperature=float("nan")))) == (
        "temperature must be a finite number >= 0, got nan"
    )
    assert _message(lambda: validate.sampling(s(top_p=-0.5))) == "top_p must be in (0, 1], got -0.5"
    assert _message(lambda: validate.sampling(s(top_p=float("inf")))) == (
        "top_p must be in (0, 1], got inf"
    )
    assert _message(lambda: validate.logprob_count("prompt_logprobs", -1)) == (
        "prompt_logprobs must be in [0, 20], got -1"
    )
    # proto3 zeros mean "unset" and pass; so do the documented "off" values
    validate.prompt([1, 2], 10, 8)
    validate.max_tokens(None)
    validate.sampling(s(temperature=0.0, top_p=0.0, top_k=-1, repetition_penalty=0.0))
    validate.logprob_count("logprobs", None)


@pytest.mark.unit
def test_the_shared_table_covers_every_rule_with_distinct_messages() -> None:
    messages = [c.message(vocab_size=100, context_length=64) for c in BAD_REQUESTS]
    assert len(set(messages)) == len(BAD_REQUESTS) == 12
    for case in BAD_REQUESTS:  # every wire can express every case
        for wire in case.wires:
            assert case.request(wire, vocab_size=100, context_length=64).request_id


@pytest.mark.unit
def test_model_facts_fill_each_wire_with_the_fields_it_has() -> None:
    facts = ModelFacts(
        model_path="/m",
        vocab_size=100,
        max_context_length=64,
        tokenizer_path="/m/tok",
        architectures=("LlamaForCausalLM",),
        eos_token_ids=(2,),
        default_sampling_params={"temperature": 0.6},
        id2label={"0": "neg"},
    )
    mlx = facts.to_proto(mlx_engine_pb2.GetModelInfoResponse)
    assert (mlx.served_model_name, mlx.max_req_input_len, list(mlx.eos_token_ids)) == (
        "/m",
        64,
        [2],
    )
    vllm = facts.to_proto(vllm_engine_pb2.GetModelInfoResponse)
    assert vllm.tokenizer_path == "/m/tok"
    assert vllm.default_sampling_params_json == '{"temperature":0.6}'
    sglang = facts.to_proto(sglang_scheduler_pb2.GetModelInfoResponse)
    assert sglang.id2label_json == '{"0": "neg"}'
    assert list(sglang.architectures) == ["LlamaForCausalLM"]


@pytest.mark.unit
async def test_watchdog_reports_the_first_death_within_its_interval() -> None:
    cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
    child = await asyncio.to_thread(subprocess.Popen, cmd)
    flag: list[str] = []
    ticks: list[int] = []
    dog = Watchdog([lambda: flag[0] if flag else None, child_exited("scheduler 0", child)], 0.05)
    dog.on_tick = lambda: ticks.append(1)
    reason = await asyncio.wait_for(dog.wait_dead(), 10)
    assert reason == "scheduler 0 exited with code 3"
    flag.append("SIGQUIT from a scheduler")
    assert dog.dead_reason() == "SIGQUIT from a scheduler"  # checks run in order


@pytest.mark.unit
def test_a_stray_environment_read_in_src_fails_lint() -> None:
    stray = "import os\n\nVALUE = os.environ.get('SMG_SOMETHING')\n"
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename"]
    in_src = REPO / "packages/smg-servicer-mlx/src/smg_servicer_mlx/stray.py"
    result = subprocess.run(
        [*ruff, str(in_src), "-"], input=stray, capture_output=True, text=True, cwd=REPO,
        check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "TID251" in result.stdout
    in_tests = REPO / "packages/smg-servicer-mlx/tests/test_stray.py"
    allowed = subprocess.run(
        [*ruff, str(in_tests), "-"], input=stray, capture_output=True, text=True, cwd=REPO,
        check=False,
    )  # fmt: skip
    assert "TID251" not in allowed.stdout

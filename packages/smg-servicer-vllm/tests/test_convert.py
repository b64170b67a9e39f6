"""vLLM outputs -> proto (pure; fake Logprob objects with vLLM's attributes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from smg_servicer_vllm import convert
from smg_servicer_vllm.servicer import trace_headers

pytestmark = pytest.mark.unit


@dataclass
class Lp:
    logprob: float
    rank: int | None


@dataclass
class Completion:
    finish_reason: str | None
    stop_reason: Any = None


def test_output_logprobs_take_the_sampled_token_and_rank_ordered_top() -> None:
    positions = [{7: Lp(-0.5, 2), 3: Lp(-0.1, 1), 9: Lp(-2.0, 3)}, {4: Lp(-0.2, 1), 5: Lp(-0.9, 2)}]
    message = convert.output_logprobs([7, 4], positions, n=2)
    assert message is not None
    assert list(message.token_ids) == [7, 4]
    assert list(message.token_logprobs) == pytest.approx([-0.5, -0.2])
    assert list(message.top_logprobs[0].token_ids) == [3, 7]
    assert list(message.top_logprobs[1].values) == pytest.approx([-0.2, -0.9])
    assert convert.output_logprobs([7], None, 2) is None


def test_input_logprobs_leave_the_first_position_unset() -> None:
    message = convert.input_logprobs([1, 2], [None, {2: Lp(-1.5, 4)}], n=1)
    assert message is not None
    assert not message.token_logprobs[0].HasField("value")
    assert message.token_logprobs[1].value == pytest.approx(-1.5)
    assert list(message.top_logprobs[1].token_ids) == []  # rank 4 is outside the top 1


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (Completion("stop", 13), {"finish_reason": "stop", "matched_token_id": 13}),
        (Completion("stop", "END"), {"finish_reason": "stop", "matched_stop_str": "END"}),
        (Completion("length"), {"finish_reason": "length"}),
        (Completion(None), {"finish_reason": "stop"}),
    ],
)
def test_finish_fields(completion: Completion, expected: dict[str, Any]) -> None:
    assert convert.finish_fields(completion) == expected


def test_kv_params_go_back_as_json_and_legacy_mirror() -> None:
    fields = convert.kv_params_fields(
        {"remote_host": "10.0.0.2", "remote_port": 7000, "remote_block_ids": [1, 2]}
    )
    assert json.loads(fields["kv_transfer_params_json"])["remote_block_ids"] == [1, 2]
    assert fields["kv_transfer_params"].remote_port == 7000
    assert convert.kv_params_fields(None) == {}
    assert "kv_transfer_params" not in convert.kv_params_fields({"remote_port": 0})


class _Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata


def test_trace_headers_pass_w3c_context_only() -> None:
    context = _Context(
        [
            ("traceparent", "00-abc-def-01"),
            ("tracestate", "k=v"),
            ("user-agent", "tonic"),
            ("authorization", "secret"),
        ]
    )
    assert trace_headers(context) == {  # type: ignore[arg-type]
        "traceparent": "00-abc-def-01",
        "tracestate": "k=v",
    }
    assert trace_headers(_Context([("user-agent", "tonic")])) is None  # type: ignore[arg-type]

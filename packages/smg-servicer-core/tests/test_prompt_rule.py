"""The one prompt rule (``validate.prompt_refusal``) that every lane applies: the Python gRPC
lanes through ``validate.prompt``, the ZMQ-lane launchers of vLLM, SGLang and TokenSpeed on the
requests the router sends straight to the engine (their own tests call it through their guards)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from smg_servicer_core import validate
from smg_servicer_core.errors import InvalidRequest

VOCAB = 100
CONTEXT = 8


class Int32Array:
    """What vLLM 0.34 hands its engine core: an array with its own ``min``/``max`` (and no
    iteration needed)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def min(self) -> int:
        return min(self.ids)

    def max(self) -> int:
        return max(self.ids)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ids", "length", "why"),
    [
        ([], 0, "the prompt is empty"),
        (None, 0, "the prompt is empty"),
        ([1, VOCAB], 0, f"token id {VOCAB} is outside the vocabulary (size {VOCAB})"),
        ([-1, 5], 0, f"token id -1 is outside the vocabulary (size {VOCAB})"),
        ([1] * CONTEXT, 0, f"the prompt has {CONTEXT} tokens; the context holds {CONTEXT}"),
        ([1] * (CONTEXT + 5), 0, f"the prompt has 13 tokens; the context holds {CONTEXT}"),
        ([1] * (CONTEXT - 1), 0, ""),  # one token of room: served
        (Int32Array([1, 2, 3]), 0, ""),
        (Int32Array([1, VOCAB + 1]), 0, f"token id {VOCAB + 1} is outside the vocabulary"),
        (Int32Array([]), 0, "the prompt is empty"),
        (None, CONTEXT - 1, ""),  # embeddings: their length only
        (None, CONTEXT, f"the prompt has {CONTEXT} tokens; the context holds {CONTEXT}"),
    ],
)
def test_one_rule_one_message(ids: Any, length: int, why: str) -> None:
    got = validate.prompt_refusal(ids, VOCAB, CONTEXT, length=length)
    assert got.startswith(why) and bool(got) == bool(why), got


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ids", "why"),
    [([1] * 5000, ""), ([], "the prompt is empty"), ([VOCAB], "token id 100 is outside")],
)
def test_an_unknown_context_checks_all_but_the_length(ids: list[int], why: str) -> None:
    got = validate.prompt_refusal(ids, VOCAB, 0)
    assert got.startswith(why) and bool(got) == bool(why), got


@pytest.mark.unit
def test_the_python_lanes_raise_what_the_rule_says() -> None:
    for ids in ([], [1, VOCAB], [1] * CONTEXT):
        with pytest.raises(InvalidRequest) as err:
            validate.prompt(ids, VOCAB, CONTEXT)
        assert err.value.message == validate.prompt_refusal(ids, VOCAB, CONTEXT)
    validate.prompt([1] * (CONTEXT - 1), VOCAB, CONTEXT)

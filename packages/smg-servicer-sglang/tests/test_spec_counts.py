"""Speculative decoding counts in ``GenerateComplete`` (``spec_accepted_tokens``,
``spec_draft_tokens``) are the numbers SGLang's own tokenizer manager reports for the same output:
its ``_calculate_spec_decoding_metrics`` run here on the installed release."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import pytest

from smg_it.sglang_scheduler import token_output
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang.request_manager import _token_output  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("draft_tokens", "verify_steps", "correct", "completion"),
    [(4, 5, 9, 14), (2, 3, 1, 4), (8, 1, 7, 8), (1, 0, 0, 3)],
)
def test_speculative_counts_are_sglangs_own(
    monkeypatch: pytest.MonkeyPatch,
    draft_tokens: int,
    verify_steps: int,
    correct: int,
    completion: int,
) -> None:
    tokenizer_manager: Any = importlib.import_module("sglang.srt.managers.tokenizer_manager")
    spec = SimpleNamespace(speculative_num_draft_tokens=draft_tokens, speculative_algorithm="EAGLE")
    monkeypatch.setattr(tokenizer_manager, "get_spec", lambda: spec)
    monkeypatch.setattr(sg, "get_spec", lambda: spec)
    batch = token_output("r", list(range(completion)), completion, {"type": "length"})
    batch.spec_verify_ct = [verify_steps]
    batch.spec_num_correct_drafts = [correct]
    theirs: dict[str, Any] = {}
    tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics(
        SimpleNamespace(), theirs, batch, 0
    )
    ours = _token_output(batch, 0, sg.drafts_per_verify())
    assert ours.spec_drafts == theirs.get("spec_num_proposed_drafts", 0)
    assert ours.spec_accepted == theirs.get("spec_num_correct_drafts", 0)
    if verify_steps and draft_tokens > 1:
        assert ours.spec_accepted / ours.spec_drafts == theirs["spec_accept_rate"]

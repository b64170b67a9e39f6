"""The scheduler-side grammar hooks (:mod:`smg_servicer_sglang.grammar_hooks`) on stand-ins for
SGLang's request, grammar and finish objects, and the finish -> status mapping they feed. The
real scheduler runs them in ``test_engine.py``."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import torch

from smg_servicer_core.errors import ConstraintFailed, ServicerError, status_for
from smg_servicer_sglang import convert, grammar_hooks

pytestmark = pytest.mark.unit


class Abort:
    """SGLang's ``FINISH_ABORT`` shape: ``(message, status_code, err_type)``."""

    def __init__(self, message: str, status_code: Any = None, err_type: Any = None) -> None:
        self.message, self.status_code, self.err_type = message, status_code, err_type


class Grammar:
    def __init__(self, rejects: bool = False) -> None:
        self.rejects = rejects
        self.accepted: list[int] = []


class Req:
    def __init__(self, grammar: Grammar | None) -> None:
        self.rid = "r"
        self.grammar = grammar
        self.to_finish: Any = None
        self.finished_reason: Any = None

    def finished(self) -> bool:
        return self.finished_reason is not None

    def update_finish_state(self) -> None:  # SGLang's: a pending to_finish becomes the finish
        if self.to_finish is not None:
            self.finished_reason, self.to_finish = self.to_finish, None


def sglang_accept(processor: Any, req: Req, tokens: Any) -> list[int]:
    """SGLang's ``_accept_grammar_tokens``: a rejected token aborts with its own words."""
    assert req.grammar is not None
    if req.grammar.rejects:
        req.to_finish = Abort("Grammar accept_token failed: ...", 500, "InternalServerError")
        return []
    ids = [tokens] if isinstance(tokens, int) else list(tokens)
    req.grammar.accepted.extend(ids)
    return ids


def test_a_row_the_grammar_leaves_empty_is_marked_and_made_finite() -> None:
    inf = float("-inf")
    logits = torch.tensor([[inf, inf, inf], [inf, 1.0, inf], [inf, inf, inf], [inf, inf, inf]])
    dead, live, free = Grammar(), Grammar(), Grammar()
    rows = grammar_hooks.mark_dead_ends(logits, [dead, live, None, free])
    # Row 2 has no grammar (not ours to judge); row 3's grammar is the last one.
    assert rows == [0, 3]
    assert grammar_hooks.is_dead_end(dead) and grammar_hooks.is_dead_end(free)
    assert not grammar_hooks.is_dead_end(live)
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[3]).all()
    assert logits[1].tolist() == [inf, 1.0, inf]
    assert torch.isneginf(logits[2]).all()


def test_rows_that_do_not_map_onto_requests_are_left_alone() -> None:
    logits = torch.full((4, 3), float("-inf"))  # e.g. speculative drafts: 2 rows per request
    assert grammar_hooks.mark_dead_ends(logits, [Grammar(), Grammar()]) == []
    assert grammar_hooks.mark_dead_ends(logits, None) == []
    assert torch.isneginf(logits).all()


def test_a_dead_end_ends_its_request_as_a_constraint_failure_without_advancing() -> None:
    req = Req(Grammar())
    grammar_hooks.mark_dead_ends(torch.full((1, 3), float("-inf")), [req.grammar])
    grammar_hooks.around_finish(Abort)(Req.update_finish_state, req)
    finish = req.finished_reason
    assert isinstance(finish, Abort)
    assert finish.err_type == grammar_hooks.ERR_TYPE
    assert finish.status_code == 400
    assert finish.message == grammar_hooks.DEAD_END_DETAIL
    # The token drawn from the made-finite row is not the grammar's: never accepted.
    assert grammar_hooks.around_accept(Abort)(sglang_accept, None, req, 0) == []
    assert req.grammar is not None and req.grammar.accepted == []


def test_a_live_request_finishes_as_sglang_decides() -> None:
    req = Req(Grammar())
    grammar_hooks.around_finish(Abort)(Req.update_finish_state, req)
    assert req.finished_reason is None
    assert grammar_hooks.around_accept(Abort)(sglang_accept, None, req, 7) == [7]
    assert req.to_finish is None


def test_sglang_s_own_rejection_is_stamped_where_it_happens() -> None:
    req = Req(Grammar(rejects=True))
    grammar_hooks.around_accept(Abort)(sglang_accept, None, req, [5, 9])
    assert req.to_finish.err_type == grammar_hooks.ERR_TYPE
    assert req.to_finish.message == "the grammar rejected the sampled token (5, 9)"

    def sglang_prefill(processor: Any, *, req: Req, next_token_id: int, already_advanced: bool):
        if not already_advanced:
            sglang_accept(processor, req, next_token_id)

    first = Req(Grammar(rejects=True))
    grammar_hooks.around_prefill(Abort)(
        sglang_prefill, None, req=first, next_token_id=4, already_advanced=False
    )
    assert first.to_finish.err_type == grammar_hooks.ERR_TYPE


def test_an_abort_set_before_the_grammar_step_is_not_restamped() -> None:
    req = Req(Grammar(rejects=True))
    earlier = Abort("client went away")
    req.to_finish = earlier

    def keeps(processor: Any, req: Req, tokens: Any) -> list[int]:
        return []

    grammar_hooks.around_accept(Abort)(keeps, None, req, 1)
    assert req.to_finish is earlier and earlier.err_type is None


def test_install_registers_every_hook_and_applies_them() -> None:
    class Registry:
        registered: list[str] = []
        applied = False

        @classmethod
        def register(cls, target: str, hook: Any, kind: Any) -> None:
            assert kind == "around" and callable(hook)
            cls.registered.append(target.rsplit(".", 2)[-2] + "." + target.rsplit(".", 1)[-1])

        @classmethod
        def apply_hooks(cls) -> None:
            cls.applied = True

    grammar_hooks.install(Registry, "around", Abort)
    assert sorted(Registry.registered) == [
        "Req.update_finish_state",
        "SamplingBatchInfo.apply_logits_bias",
        "SamplingBatchInfo.apply_logits_bias_with_observer",
        "SchedulerBatchResultProcessor._accept_grammar_tokens",
        "SchedulerBatchResultProcessor._apply_prefill_grammar",
    ]
    assert Registry.applied


@pytest.mark.parametrize(
    ("finish", "code"),
    [
        (
            {
                "type": "abort",
                "message": "x",
                "status_code": 400,
                "err_type": "GrammarRejectedToken",
            },
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        # The attribution is the stamp, never the text: SGLang's own words stay an engine fault.
        (
            {
                "type": "abort",
                "message": "Grammar accept_token failed: Tokens not accepted: 3",
                "status_code": 500,
                "err_type": "InternalServerError",
            },
            grpc.StatusCode.INTERNAL,
        ),
        ({"type": "abort", "message": "bad", "status_code": 400}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_the_finish_maps_to_its_status(finish: dict[str, Any], code: grpc.StatusCode) -> None:
    error = convert.failure(finish)
    assert isinstance(error, ServicerError)
    assert status_for(error)[0] == code
    assert isinstance(error, ConstraintFailed) == (code == grpc.StatusCode.FAILED_PRECONDITION)


def test_the_stamped_targets_exist_in_this_sglang() -> None:
    """The hooks' dotted paths name SGLang 0.5.23's methods (a rename would leave them unhooked:
    the registry only logs a failed target)."""
    import pkgutil

    from smg_servicer_sglang import _sglang as sg

    for target in (
        "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.apply_logits_bias",
        "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.apply_logits_bias_with_observer",
        "sglang.srt.managers.schedule_batch.Req.update_finish_state",
        f"{grammar_hooks._RESULTS}._accept_grammar_tokens",
        f"{grammar_hooks._RESULTS}._apply_prefill_grammar",
    ):
        owner, name = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(owner), name)), target
    wire = sg.FINISH_ABORT("m", 400, grammar_hooks.ERR_TYPE).to_json()
    assert wire["err_type"] == grammar_hooks.ERR_TYPE and wire["type"] == "abort"

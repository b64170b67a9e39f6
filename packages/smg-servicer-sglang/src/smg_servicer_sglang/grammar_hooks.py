"""Scheduler-side hooks that make SGLang say when a request's constraint cannot continue.

SGLang 0.5.23 ends a request whose sampled token its grammar matcher rejects with
``FINISH_ABORT("Grammar accept_token failed: ...", 500, "InternalServerError")``: to the servicer
that is an engine fault like any other (INTERNAL). And when the grammar allows no next token at
all (its mask, together with the request's penalties, excludes every token: a constraint that
can only end while ``min_new_tokens`` forbids the end, for one), the row's logits are all
``-inf``: the greedy sampler then takes token 0 and the torch top-k/top-p/min-p sampler of the CPU
build raises inside the scheduler, which ends the engine for every request in flight.

:func:`install` registers three kinds of hooks with SGLang's own ``HookRegistry`` in each
scheduler process (our launcher's scheduler entry calls it before SGLang's scheduler starts):

* around ``SamplingBatchInfo.apply_logits_bias`` (and its observer variant): a constrained row
  left with no allowed token is a dead end. Its grammar is marked and the row made finite, so the
  sampler cannot fail on it;
* around ``Req.update_finish_state``: a request whose grammar is marked ends there, with
  :data:`ERR_TYPE`, in the step that drew the token (which no stop rule may turn into a normal
  end: the greedy draw from the finite row is token 0, an end-of-sequence id in many models);
* around ``SchedulerBatchResultProcessor._accept_grammar_tokens`` and ``_apply_prefill_grammar``
  (where SGLang advances a request's grammar over its new token): a marked grammar is not
  advanced over the drawn token; an abort SGLang itself raises there (the matcher rejected the
  token) is stamped with :data:`ERR_TYPE`.

The attribution comes from the place, not from a message: only these two steps stamp the finish.
The servicer turns a finish with ``err_type == ERR_TYPE`` into
:class:`~smg_servicer_core.errors.ConstraintFailed` (FAILED_PRECONDITION, trailer
``smg-constraint-failed: engine``). Engine-free: SGLang's registry and ``FINISH_ABORT`` come in
as arguments (from :mod:`._sglang`). The disaggregated prefill/decode paths advance grammars
inline, out of these hooks' reach; their rejections stay SGLang's own (INTERNAL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

logger = logging.getLogger(__name__)

#: The finish ``err_type`` of a request that ended because its constraint could not continue.
ERR_TYPE = "GrammarRejectedToken"
#: The attribute a dead-ended grammar object carries (set by the sampling hook).
_DEAD_END = "_smg_dead_end"
DEAD_END_DETAIL = (
    "no token may follow the output so far: the request's other settings exclude every "
    "continuation its grammar allows (the end of output under min_new_tokens, for one)"
)

_SAMPLING = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo"
_REQ = "sglang.srt.managers.schedule_batch.Req"
_RESULTS = (
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
)


def rejected_detail(tokens: Any) -> str:
    """The client's words for a token the grammar rejected (SGLang's own message carries the
    whole grammar; it stays in the scheduler's log)."""
    ids = [tokens] if isinstance(tokens, int) else list(tokens or [])
    shown = ", ".join(str(int(t)) for t in ids) or "?"
    return f"the grammar rejected the sampled token ({shown})"


def mark_dead_ends(logits: Any, grammars: list[Any] | None) -> list[int]:
    """Mark the grammar of every row of ``logits`` that allows no token (all ``-inf``) and make
    that row finite (all zero); the rows marked. Rows without a grammar are left alone, and so is
    a batch whose rows do not map one to one onto its requests (speculative drafts)."""
    if not grammars or logits.dim() != 2 or logits.shape[0] != len(grammars):
        return []
    dead = logits.isneginf().all(dim=-1)
    if not bool(dead.any()):
        return []
    rows: list[int] = []
    for row in dead.nonzero().flatten().tolist():
        grammar = grammars[row]
        if grammar is None:
            continue
        setattr(grammar, _DEAD_END, True)
        logits[row] = 0.0
        rows.append(int(row))
    return rows


def is_dead_end(grammar: Any) -> bool:
    return bool(getattr(grammar, _DEAD_END, False))


def _is_abort(finish: Any, finish_abort: type) -> bool:
    return isinstance(finish, finish_abort)


def attribute(req: Any, before: Any, tokens: Any, finish_abort: type) -> None:
    """Stamp the abort SGLang set on ``req`` while advancing its grammar (``before``: its
    ``to_finish`` until then) as a constraint failure."""
    after = req.to_finish
    if after is before or not _is_abort(after, finish_abort):
        return
    after.err_type = ERR_TYPE
    after.status_code = HTTPStatus.BAD_REQUEST
    after.message = rejected_detail(tokens)


def around_finish(finish_abort: type) -> Callable[..., Any]:
    """AROUND hook for ``Req.update_finish_state(self, ...)``: a request whose grammar allows no
    next token ends now, as a constraint failure."""

    def hook(original: Callable[..., Any], req: Any, *args: Any, **kwargs: Any) -> Any:
        if req.to_finish is None and is_dead_end(req.grammar) and not req.finished():
            logger.info("request %s: its grammar allows no next token", req.rid)
            req.to_finish = finish_abort(DEAD_END_DETAIL, HTTPStatus.BAD_REQUEST, ERR_TYPE)
        return original(req, *args, **kwargs)

    return hook


def around_accept(finish_abort: type) -> Callable[..., Any]:
    """AROUND hook for ``_accept_grammar_tokens(self, req, tokens) -> retained``."""

    def hook(original: Callable[..., Any], processor: Any, req: Any, tokens: Any) -> Any:
        if is_dead_end(req.grammar):
            return []  # ended by around_finish; the drawn token is not the grammar's
        before = req.to_finish
        retained = original(processor, req, tokens)
        attribute(req, before, tokens, finish_abort)
        return retained

    return hook


def around_prefill(finish_abort: type) -> Callable[..., Any]:
    """AROUND hook for ``_apply_prefill_grammar(self, *, req, next_token_id, already_advanced)``."""

    def hook(original: Callable[..., Any], processor: Any, **kwargs: Any) -> Any:
        req = kwargs["req"]
        if is_dead_end(req.grammar):
            # Ended by around_finish: only sync the grammar's finished flag, without advancing it
            # over the drawn token.
            return original(processor, **{**kwargs, "already_advanced": True})
        before = req.to_finish
        result = original(processor, **kwargs)
        attribute(req, before, kwargs.get("next_token_id"), finish_abort)
        return result

    return hook


def around_bias(original: Callable[..., Any], info: Any, logits: Any, *args: Any, **kw: Any) -> Any:
    """AROUND hook for ``SamplingBatchInfo.apply_logits_bias`` and its observer variant
    (``(self, logits, ...)``)."""
    result = original(info, logits, *args, **kw)
    mark_dead_ends(logits, info.grammars)
    return result


def install(registry: Any, around: Any, finish_abort: type) -> None:
    """Register the hooks with SGLang's ``HookRegistry`` (``around``: its ``HookType.AROUND``)
    and apply them. Idempotent (the registry skips targets it already patched)."""
    registry.register(f"{_SAMPLING}.apply_logits_bias", around_bias, around)
    registry.register(f"{_SAMPLING}.apply_logits_bias_with_observer", around_bias, around)
    registry.register(f"{_REQ}.update_finish_state", around_finish(finish_abort), around)
    registry.register(f"{_RESULTS}._accept_grammar_tokens", around_accept(finish_abort), around)
    registry.register(f"{_RESULTS}._apply_prefill_grammar", around_prefill(finish_abort), around)
    registry.apply_hooks()

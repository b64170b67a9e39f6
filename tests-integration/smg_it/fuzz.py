"""Property-based ``GenerateRequest``s for every wire (hypothesis strategies).

:func:`generate_requests` draws whole requests from each wire's own descriptor: only fields the
wire has are set, each from a pool of values at and beyond its bounds (and ordinary ones, so
requests also get through the validators into the engine). Values stay inside the proto type's
range (a uint32 gets 0..2**32-1: "negative after wrap" is 2**31 and up); everything else is the
servicer's to refuse.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from smg_servicer_core.testing.requests import WIRES

UINT32 = 2**32 - 1
INT32 = 2**31 - 1
INT64 = 2**63 - 1

_FLOATS = st.sampled_from(
    [0.0, -0.0, 0.5, 1.0, 1.5, 2.0, 2.5, -1.0, -2.0, -3.0, 1e-9, 1e30, -1e30,
     math.inf, -math.inf, math.nan]
)  # fmt: skip
_TEXT = st.one_of(
    st.sampled_from(["", " ", "\n", "the", "\x00", "\ud7ff", "é" * 300, "x" * 5000]),
    st.text(max_size=20),
)
_JSON_SCHEMAS = st.sampled_from(
    ['{"type": "object"}', '{"type": "string", "maxLength": 4}', '{"type":', "[]", "null",
     '{"type": "nonsense"}', '{"properties": 5}', "", "{" * 200]
)  # fmt: skip
_REGEXES = st.sampled_from(["[a-z]+", "a|b", "([", "(?P<x", "*", "", "a{99999999}", "\\"])
_ADAPTERS = st.one_of(
    st.sampled_from(["a", "base", "0", "../../etc/passwd", "/tmp", "x" * 5000, "\x00", "a:b"]),
    st.text(min_size=1, max_size=16),
)
_GRAMMARS = st.sampled_from(['root ::= "a"', "root ::=", "::= ::=", "", "root ::= root"])


def _uint(bound: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, 8), st.sampled_from([20, 21, 64, 1023, 1024, 1025, 2**31, bound])
    )


def _int(bound: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(-3, 8), st.sampled_from([20, 21, 64, 1024, -(2**31), bound, -bound])
    )


def _ids(vocab: int, context: int) -> st.SearchStrategy[list[int]]:
    inside = st.integers(0, max(vocab - 1, 0))
    edge = st.sampled_from([vocab - 1, vocab, vocab + 1, 2**31, UINT32])
    return st.one_of(
        st.just([]),
        st.lists(inside, min_size=1, max_size=24),
        st.lists(st.one_of(inside, edge), min_size=1, max_size=8),
        st.sampled_from([context - 2, context - 1, context, context + 1, 4 * context]).map(
            lambda n: [1] * max(n, 1)
        ),
    )


def _max_tokens(context: int) -> st.SearchStrategy[int]:
    # Mostly short, so a valid request finishes quickly; now and then at the context's edge.
    return st.one_of(
        st.integers(0, 4),
        st.sampled_from([0, 1, context - 6, context - 5, context, context + 1, INT32, UINT32]),
    )


def _by_type(field: Any, floats: Any, ints: Any, uints: Any, text: Any) -> Any:
    kind = field.type
    if kind in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
        return floats
    if kind == field.TYPE_BOOL:
        return st.booleans()
    if kind == field.TYPE_STRING:
        return text
    if kind in (field.TYPE_UINT32, field.TYPE_UINT64):
        return uints(UINT32 if kind == field.TYPE_UINT32 else 2**64 - 1)
    if kind in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_INT64, field.TYPE_SINT64):
        return ints(INT32 if kind in (field.TYPE_INT32, field.TYPE_SINT32) else INT64)
    return st.nothing()


def _field_value(name: str, field: Any, vocab: int) -> st.SearchStrategy[Any]:
    """The wild pool for one SamplingParams field: at and beyond its bounds, from its name first
    and its proto type otherwise."""
    by_name: dict[str, st.SearchStrategy[Any]] = {
        "stop": st.lists(_TEXT, max_size=4),
        "stop_token_ids": st.lists(
            st.sampled_from([0, 1, 2, vocab - 1, vocab, UINT32]), max_size=4
        ),
        "json_schema": _JSON_SCHEMAS,
        "regex": _REGEXES,
        "grammar": _GRAMMARS,
        "ebnf_grammar": _GRAMMARS,
        "structural_tag": _GRAMMARS,
    }
    if name in by_name:
        return by_name[name]
    return _by_type(field, _FLOATS, _int, _uint, _TEXT)


def _tame_value(name: str, field: Any, vocab: int) -> st.SearchStrategy[Any]:
    """An ordinary value for one field, so a request with one wild field reaches the engine."""
    by_name: dict[str, st.SearchStrategy[Any]] = {
        "stop": st.lists(st.sampled_from(["the", "\n", "zz"]), max_size=2),
        "stop_token_ids": st.lists(st.integers(0, vocab - 1), max_size=2),
        "json_schema": st.just('{"type": "object"}'),
        "regex": st.just("[a-z]+"),
        "grammar": st.nothing(),
        "ebnf_grammar": st.nothing(),
        "structural_tag": st.nothing(),
        "logprobs": st.integers(0, 3),
        "prompt_logprobs": st.integers(0, 3),
    }
    if name in by_name:
        return by_name[name]
    small = st.sampled_from([0, 1, 2])
    return _by_type(
        field, st.sampled_from([0.0, 0.5, 1.0]), lambda _: small, lambda _: small, st.just("")
    )


#: SamplingParams fields left to their own strategies below (or not drawn at all).
_SPECIAL = {"max_tokens", "max_new_tokens", "logit_bias", "choice", "custom_params", "json_object"}


def _draw_extras(draw: st.DrawFn, params: Any, vocab: int) -> None:
    """The message-typed SamplingParams fields: logit bias, choice, json_object."""
    fields = params.DESCRIPTOR.fields_by_name
    if "logit_bias" in fields and draw(st.integers(0, 5)) == 0:
        # map<int32, float> on vLLM and MLX, map<string, float> on SGLang and TokenSpeed.
        key = draw(st.sampled_from([0, 1, vocab - 1, vocab, -1, INT32]))
        text_keys = fields["logit_bias"].message_type.fields_by_name["key"].type == 9
        if text_keys:
            params.logit_bias[draw(st.sampled_from([str(key), "", "x", "1e3"]))] = draw(_FLOATS)
        else:
            params.logit_bias[key] = draw(_FLOATS)
    if "choice" in fields and draw(st.integers(0, 7)) == 0:
        params.choice.choices.extend(draw(st.lists(_TEXT, max_size=3)))
    if "json_object" in fields and draw(st.integers(0, 7)) == 0:
        params.json_object = True


@st.composite
def generate_requests(draw: st.DrawFn, wire: str, vocab: int, context: int) -> Any:
    module, max_field = WIRES[wire]
    params = module.SamplingParams()
    names = [
        name
        for name, field in params.DESCRIPTOR.fields_by_name.items()
        if name not in _SPECIAL and field.message_type is None
    ]
    # One request in three is wild everywhere; the others are ordinary but for one field (or
    # none), so they get past the validators and into the engine.
    all_wild = draw(st.integers(0, 2)) == 0
    wild = draw(st.sampled_from([None, *names]))
    for name in names:
        field = params.DESCRIPTOR.fields_by_name[name]
        if name != wild and draw(st.integers(0, 3)) != 0:  # others set in one request of four
            continue
        pool = (
            _field_value(name, field, vocab)
            if all_wild or name == wild
            else _tame_value(name, field, vocab)
        )
        chosen = None if pool.is_empty else draw(pool)
        if chosen is None:
            continue
        if field.is_repeated:
            getattr(params, name).extend(chosen)
        else:
            setattr(params, name, chosen)
    if all_wild or wild == max_field:
        setattr(params, max_field, draw(_max_tokens(context)))
    else:
        setattr(params, max_field, draw(st.integers(1, 4)))
    _draw_extras(draw, params, vocab)
    request = module.GenerateRequest(
        request_id=draw(
            st.one_of(
                st.just(""),
                st.text(max_size=12),
                st.sampled_from(["x" * 100_000, "dup", "\x00", "../../etc/passwd"]),
            )
            if all_wild or wild is None
            else st.text(min_size=1, max_size=12)
        ),
        tokenized=module.TokenizedInput(
            input_ids=draw(
                _ids(vocab, context)
                if all_wild or wild is None
                else st.lists(st.integers(0, vocab - 1), min_size=1, max_size=24)
            )
        ),
        sampling_params=params,
        stream=draw(st.booleans()),
    )
    top = request.DESCRIPTOR.fields_by_name
    if "return_logprob" in top and draw(st.integers(0, 3)) == 0:
        request.return_logprob = True
        request.top_logprobs_num = draw(_int(INT32))
        request.logprob_start_len = draw(_int(INT32))
        request.token_ids_logprob.extend(
            draw(st.lists(st.sampled_from([0, vocab, UINT32]), max_size=3))
        )
    if "data_parallel_rank" in top and draw(st.integers(0, 7)) == 0:
        request.data_parallel_rank = draw(_int(INT32))
    if "lora_id" in top and draw(st.integers(0, 7)) == 0:
        # Adapter names, ids and paths (SGLang's scheduler asserted on an unknown id and died).
        request.lora_id = draw(_ADAPTERS)
    return request

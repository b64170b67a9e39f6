"""EBNF grammars with a rule that derives no text are refused (xgrammar decides, as in SGLang)."""

from __future__ import annotations

import pytest

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_sglang import grammar

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("ebnf", "dead"),
    [
        ("root ::= root", ("root",)),  # the fuzz's find
        ('root ::= "a" b | "c"\nb ::= b "x"', ("b",)),  # a dead end behind a live first byte
        ('root ::= "a" | root', ()),  # recursion with a way out
        ('root ::= item*\nitem ::= "x" item | "y"', ()),
        ('root ::= ""', ()),  # the empty text is text: the stop is allowed
    ],
)
def test_rules_that_derive_no_text(ebnf: str, dead: tuple[str, ...]) -> None:
    assert grammar.dead_rules(ebnf) == dead


@pytest.mark.parametrize("ebnf", ["::= ::=", "", "root ::= (", "root ::= missing"])
def test_what_xgrammar_cannot_parse_is_left_to_sglang(ebnf: str) -> None:
    assert grammar.dead_rules(ebnf) == ()


def test_the_builtin_json_grammar_is_alive() -> None:
    import xgrammar as xg

    assert grammar.dead_rules(str(xg.Grammar.builtin_json_grammar())) == ()


async def test_a_dead_end_is_a_client_fault_naming_the_rule() -> None:
    with pytest.raises(InvalidRequest, match="rule 'b' derives no text"):
        await grammar.refuse_dead_ends('root ::= "a" b\nb ::= b "x"')
    await grammar.refuse_dead_ends('root ::= "a"')


def test_a_grammar_past_the_rule_bound_is_refused() -> None:
    rules = "\n".join(f'r{i} ::= "x"' for i in range(grammar.MAX_RULES))
    with pytest.raises(InvalidRequest, match=f"at most {grammar.MAX_RULES}"):
        grammar.dead_rules(f"root ::= r0\n{rules}")

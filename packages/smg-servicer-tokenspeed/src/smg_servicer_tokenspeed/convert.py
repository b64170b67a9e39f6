"""``tokenspeed.grpc.scheduler`` messages <-> plain values, pure (no TokenSpeed, no gRPC server).

Requests: :func:`generate_specs` checks a ``GenerateRequest`` with core's shared rules
(:mod:`smg_servicer_core.validate`, the same messages as every engine) and turns it into one
:class:`ChildSpec` per choice. ``n > 1`` is expanded here into ``n`` single requests with the ids
``{rid}-n{i}`` (so ``Abort`` and a client cancel reach each child by name, and the scheduler sees
who is who); each child's seed is the request's ``sampling_seed + i`` unless it decodes greedily.
The sampling fields follow TokenSpeed's ``SamplingParams``: every ``optional`` scalar is sent only
when the request set it, so TokenSpeed's own defaults apply otherwise; ``custom_params`` is
forwarded (the implementation we replace dropped it).

Outputs: TokenSpeed's front end yields one dict per step with the *cumulative* ``output_ids``
(the servicer runs it with the inline detokenizer off), counts in ``meta_info`` and the logprob
tuples of the frames it merged. :class:`Choice` turns those into ``chunk`` deltas and one
``complete`` per choice: the generated ids are the last ``completion_tokens`` of ``output_ids``;
a matched stop token is trimmed from the output unless ``no_stop_trim``; logprobs are sliced to
the ids they belong to, with an empty ``TopLogProbs`` where a position has none, so positions line
up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf import json_format

from smg_servicer_core import validate
from smg_servicer_core.errors import InvalidRequest, ServicerError, from_http_status
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_tokenspeed import mm
from smg_servicer_tokenspeed.mm import MmItem

#: The most choices one request may ask for.

#: ``SamplingParams`` scalars TokenSpeed takes as they are when the request set them.
_OPTIONAL_SCALARS = (
    "temperature",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "max_new_tokens",
)


@dataclass(frozen=True)
class Limits:
    """What the validators check against (from the engine at start-up)."""

    vocab_size: int
    context_length: int
    #: A PD decode worker (``--disaggregation-mode decode``): a request's KV comes from its
    #: prefill, so its multimodal items may come without their encoder input.
    decode_role: bool = False


@dataclass(frozen=True)
class ChildSpec:
    """One engine request: a choice of a ``GenerateRequest``, as plain values."""

    rid: str
    index: int
    input_ids: list[int]
    sampling: dict[str, Any]
    stream: bool
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    bootstrap: tuple[str, int, int] | None = None
    data_parallel_rank: int | None = None
    no_stop_trim: bool = False
    #: Router-preprocessed multimodal items (built into TokenSpeed's objects per choice).
    mm_items: list[MmItem] | None = None


def child_id(request_id: str, index: int) -> str:
    """The engine id of choice ``index`` of an ``n > 1`` request."""
    return f"{request_id}-n{index}"


def choices(params: pb.SamplingParams) -> int:
    return validate.choices(params.n)


def sampling(params: pb.SamplingParams) -> dict[str, Any]:
    """TokenSpeed's ``SamplingParams`` keywords for one choice (validated with core's rules)."""
    validate.sampling(validate.Sampling.of(params))
    validate.max_tokens(params.max_new_tokens if params.HasField("max_new_tokens") else None)
    out: dict[str, Any] = {
        name: getattr(params, name) for name in _OPTIONAL_SCALARS if params.HasField(name)
    }
    # proto3 and core's rules read 0 as "off" for these; TokenSpeed refuses a literal 0.
    if params.HasField("top_p") and params.top_p > 0:
        out["top_p"] = params.top_p
    if params.HasField("top_k") and params.top_k != 0:
        out["top_k"] = params.top_k
    if params.HasField("repetition_penalty") and params.repetition_penalty > 0:
        out["repetition_penalty"] = params.repetition_penalty
    if params.HasField("sampling_seed"):
        out["seed"] = params.sampling_seed
    if params.min_new_tokens > 0:
        out["min_new_tokens"] = params.min_new_tokens
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    out["ignore_eos"] = params.ignore_eos
    out["skip_special_tokens"] = params.skip_special_tokens
    out["spaces_between_special_tokens"] = params.spaces_between_special_tokens
    out["no_stop_trim"] = params.no_stop_trim
    if params.logit_bias:
        out["logit_bias"] = _logit_bias(params.logit_bias)
    constraint = params.WhichOneof("constraint")
    if constraint is not None:
        key = "ebnf" if constraint == "ebnf_grammar" else constraint
        out[key] = getattr(params, constraint)
    if params.HasField("custom_params"):
        out["custom_params"] = json_format.MessageToDict(params.custom_params)
    return out


def _logit_bias(bias: Mapping[str, float]) -> dict[str, float]:
    for key, value in bias.items():
        if not key.lstrip("-").isdigit():
            raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}")
        if not math.isfinite(value):
            raise InvalidRequest(f"logit_bias values must be finite, got {value}")
    return dict(bias)


def _greedy(values: Mapping[str, Any]) -> bool:
    temperature = values.get("temperature")
    return values.get("top_k") == 1 or (temperature is not None and temperature < 1e-6)


def generate_specs(request: pb.GenerateRequest, limits: Limits) -> list[ChildSpec]:
    """The engine requests of one ``GenerateRequest`` (one per choice)."""
    if not request.HasField("tokenized"):
        raise InvalidRequest("this worker takes tokenized input only (set tokenized.input_ids)")
    ids = list(request.tokenized.input_ids)
    validate.prompt(ids, limits.vocab_size, limits.context_length)
    validate.logprob_count("logprobs", request.top_logprobs_num)
    for token in request.token_ids_logprob:
        if token >= limits.vocab_size:
            raise InvalidRequest(
                f"token id {token} is outside the vocabulary (size {limits.vocab_size})"
            )
    params = request.sampling_params
    n = choices(params)
    values = sampling(params)
    bootstrap = None
    if request.HasField("kv_bootstrap_info"):
        info = request.kv_bootstrap_info
        bootstrap = (info.bootstrap_host, info.bootstrap_port, info.bootstrap_room)
    rank = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
    if rank is not None and rank < 0:
        raise InvalidRequest(f"data_parallel_rank must not be negative, got {rank}")
    start = request.logprob_start_len if request.HasField("logprob_start_len") else None
    items = mm.items(request, limits.decode_role)
    specs: list[ChildSpec] = []
    for index in range(n):
        child = dict(values)
        if n > 1 and "seed" in child and not _greedy(child):
            child["seed"] = child["seed"] + index
        specs.append(
            ChildSpec(
                rid=child_id(request.request_id, index) if n > 1 else request.request_id,
                index=index,
                input_ids=ids,
                sampling=child,
                stream=request.stream,
                return_logprob=request.return_logprob,
                logprob_start_len=start,
                top_logprobs_num=request.top_logprobs_num,
                token_ids_logprob=list(request.token_ids_logprob) or None,
                bootstrap=bootstrap,
                data_parallel_rank=rank,
                no_stop_trim=params.no_stop_trim,
                mm_items=items,
            )
        )
    return specs


# -- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One output dict of TokenSpeed's front end, read."""

    #: Every id the choice generated so far (cumulative).
    ids: list[int]
    finish: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    #: ``(logprob, token_id, text)`` per position, as many as the front end merged.
    token_logprobs: list[Any]
    top_logprobs: list[Any]
    spec_accepted_tokens: int = 0
    spec_draft_tokens: int = 0
    weight_version: str | None = None


def _int(meta: Mapping[str, Any], key: str) -> int:
    value = meta.get(key)
    return max(int(value), 0) if isinstance(value, int | float) else 0


def frame(output: Mapping[str, Any]) -> Frame:
    meta: Mapping[str, Any] = output.get("meta_info") or {}
    completion = _int(meta, "completion_tokens")
    raw: list[Any] = list(output.get("output_ids") or [])
    ids = [int(t) for t in raw]
    if 0 < completion < len(ids):
        ids = ids[-completion:]
    finish: Any = meta.get("finish_reason")
    version = meta.get("weight_version")
    return Frame(
        ids=ids,
        finish=dict(finish) if isinstance(finish, Mapping) else None,  # pyright: ignore[reportUnknownArgumentType]
        prompt_tokens=_int(meta, "prompt_tokens"),
        completion_tokens=completion,
        cached_tokens=_int(meta, "cached_tokens"),
        token_logprobs=list(meta.get("output_token_logprobs") or []),
        top_logprobs=list(meta.get("output_top_logprobs") or []),
        spec_accepted_tokens=_int(meta, "spec_accepted_tokens"),
        spec_draft_tokens=_int(meta, "spec_draft_tokens"),
        weight_version=str(version) if version is not None else None,
    )


def merged(frames: Sequence[Frame]) -> Frame:
    """Consecutive frames of one choice as one: ids, counts and the finish are cumulative (the
    last frame's); logprob tuples are each frame's own, so they are joined in order."""
    last = frames[-1]
    if len(frames) == 1:
        return last
    return replace(
        last,
        token_logprobs=[entry for f in frames for entry in f.token_logprobs],
        top_logprobs=[row for f in frames for row in f.top_logprobs],
    )


def finish_reason(finish: Mapping[str, Any] | None) -> str:
    kind = (finish or {}).get("type")
    if kind in ("length", "abort"):
        return str(kind)
    return "stop"


def failure(finish: Mapping[str, Any] | None, request_id: str) -> ServicerError | None:
    """The error a scheduler abort stands for (None: not an abort). An abort with an HTTP
    ``status_code`` maps through the HTTP table with the scheduler's message; one without is a
    server fault with a generic message (the scheduler's text goes to the log)."""
    if finish is None or finish.get("type") != "abort":
        return None
    status = finish.get("status_code")
    message = str(finish.get("message") or "the engine aborted the request")
    if status is not None:
        return from_http_status(status, message)
    return ServicerError(f"the engine aborted request {request_id}")


def _matched_stop(finish: Mapping[str, Any] | None) -> int | str | None:
    if not finish or finish.get("type") != "stop":
        return None
    matched = finish.get("matched")
    return matched if isinstance(matched, int | str) else None


def _logprobs(entries: Sequence[Any], tops: Sequence[Any], want_top: bool) -> pb.OutputLogProbs:
    out = pb.OutputLogProbs()
    for entry in entries:
        value = entry[0] if entry else None
        out.token_logprobs.append(float(value) if value is not None else 0.0)
        out.token_ids.append(int(entry[1]) if entry and len(entry) > 1 else 0)
    if want_top:
        for position in range(len(entries)):
            row: Sequence[Any] = (tops[position] if position < len(tops) else None) or []
            top = pb.TopLogProbs()
            for item in row:
                top.values.append(float(item[0]) if item[0] is not None else 0.0)
                top.token_ids.append(int(item[1]))
            out.top_logprobs.append(top)
    return out


@dataclass
class Choice:
    """The stream of one choice: what was sent, and the next message."""

    index: int
    stream: bool
    no_stop_trim: bool
    return_logprob: bool
    want_top: bool
    sent: int = 0
    chunks: int = 0
    last: Frame | None = field(default=None, repr=False)

    def _kept(self, f: Frame) -> list[int]:
        """The choice's output ids so far, a matched stop token trimmed (unless asked not to)."""
        ids = f.ids
        matched = _matched_stop(f.finish)
        if isinstance(matched, int) and not self.no_stop_trim and ids and ids[-1] == matched:
            return ids[:-1]
        return ids

    def _aligned(self, f: Frame, raw: int, kept: int) -> tuple[list[Any], list[Any]]:
        """The logprob entries of the last ``raw`` positions, the first ``kept`` of them."""
        if not self.return_logprob or raw <= 0:
            return [], []
        entries = f.token_logprobs[-raw:][:kept]
        tops = f.top_logprobs[-raw:][:kept] if self.want_top else []
        return entries, tops

    def chunk(self, f: Frame) -> pb.GenerateStreamChunk | None:
        """The stream message for frame ``f`` (None when it adds nothing to send): the new ids
        (the delta), counts as TokenSpeed reports them (cumulative), the new logprobs."""
        self.last = f
        kept = self._kept(f)
        delta = kept[self.sent :]
        raw = len(f.ids) - self.sent
        if not delta and self.chunks > 0:
            return None
        self.sent = len(kept)
        self.chunks += 1
        message = pb.GenerateStreamChunk(
            token_ids=delta,
            prompt_tokens=f.prompt_tokens,
            completion_tokens=f.completion_tokens,
            cached_tokens=f.cached_tokens,
            index=self.index,
        )
        if self.return_logprob:
            entries, tops = self._aligned(f, raw, len(delta))
            message.output_logprobs.CopyFrom(_logprobs(entries, tops, self.want_top))
        if f.weight_version is not None:
            message.weight_version = f.weight_version
        return message

    def complete(self, f: Frame) -> pb.GenerateComplete:
        """The final message: every id and logprob when not streaming; counts and the finish
        only when streaming (the ids went out in chunks)."""
        kept = self._kept(f)
        message = pb.GenerateComplete(
            output_ids=[] if self.stream else kept,
            finish_reason=finish_reason(f.finish),
            prompt_tokens=f.prompt_tokens,
            completion_tokens=f.completion_tokens,
            cached_tokens=f.cached_tokens,
            index=self.index,
            spec_accepted_tokens=f.spec_accepted_tokens,
            spec_draft_tokens=f.spec_draft_tokens,
        )
        matched = _matched_stop(f.finish)
        if isinstance(matched, int):
            message.matched_token_id = matched
        elif isinstance(matched, str):
            message.matched_stop_str = matched
        if self.return_logprob and not self.stream:
            entries, tops = self._aligned(f, len(f.ids), len(kept))
            message.output_logprobs.CopyFrom(_logprobs(entries, tops, self.want_top))
        if f.weight_version is not None:
            message.weight_version = f.weight_version
        return message

    def aborted(self) -> pb.GenerateComplete:
        """The final message of a choice stopped by ``Abort`` or the client."""
        last = self.last
        return pb.GenerateComplete(
            finish_reason="abort",
            prompt_tokens=last.prompt_tokens if last else 0,
            completion_tokens=last.completion_tokens if last else 0,
            cached_tokens=last.cached_tokens if last else 0,
            index=self.index,
        )

"""Proto ``SamplingParams`` -> keyword arguments for vLLM's ``SamplingParams``. Pure: no vLLM.

proto3 "unset" rules: ``temperature``, ``max_tokens``, ``logprobs``, ``prompt_logprobs``,
``seed`` and ``truncate_prompt_tokens`` are ``optional`` (absent = vLLM's default); among the
plain scalars ``top_p`` 0 -> 1.0, ``repetition_penalty`` 0 -> 1.0, ``n`` 0 -> 1 and ``top_k`` 0
means disabled (as in vLLM). The ``constraint`` oneof becomes structured-output arguments.
Client mistakes raise :class:`InvalidRequest` (core's shared rules,
:mod:`smg_servicer_core.validate`, give the same messages as on every engine); vLLM's own
validation while the request is built (a ``ValueError``) is mapped to INVALID_ARGUMENT by
:mod:`.errors`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from smg_servicer_core import validate
from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import vllm_engine_pb2 as pb

DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True)
class SamplingSpec:
    #: Keyword arguments for ``vllm.SamplingParams`` (without output kind and constraint).
    kwargs: dict[str, Any]
    #: Keyword arguments for ``StructuredOutputsParams``, or None.
    structured: dict[str, Any] | None
    #: ``tokenization_kwargs`` for ``AsyncLLM.generate`` (prompt truncation), or None.
    tokenization: dict[str, Any] | None

    @property
    def n(self) -> int:
        return int(self.kwargs["n"])


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number")
    return value


def _structured(sp: pb.SamplingParams) -> dict[str, Any] | None:
    kind = sp.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "json_schema":
        try:
            schema = json.loads(sp.json_schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"json_schema is not valid JSON: {exc.msg}") from exc
        if not isinstance(schema, dict | bool):
            raise InvalidRequest("json_schema must be a JSON object")
        return {"json": schema}
    if kind == "choice":
        if not sp.choice.choices:
            raise InvalidRequest("choice constraint needs at least one choice")
        return {"choice": list(sp.choice.choices)}
    if kind == "json_object":
        return {"json_object": True} if sp.json_object else None
    value = getattr(sp, kind)
    if not value:
        raise InvalidRequest(f"{kind} constraint is empty")
    return {kind: value}  # regex, grammar, structural_tag


def _validate(sp: pb.SamplingParams) -> None:
    validate.sampling(validate.Sampling.of(sp))
    validate.max_tokens(sp.max_tokens if sp.HasField("max_tokens") else None)
    validate.choices(sp.n)
    for name in ("logprobs", "prompt_logprobs"):
        validate.logprob_count(name, getattr(sp, name) if sp.HasField(name) else None)
    for value in sp.logit_bias.values():
        if not (-100.0 <= _finite("logit_bias", value) <= 100.0):
            raise InvalidRequest("logit_bias values must be in [-100, 100]")


def to_sampling_spec(sp: pb.SamplingParams) -> SamplingSpec:
    _validate(sp)
    kwargs: dict[str, Any] = {
        "n": sp.n or 1,
        "temperature": sp.temperature if sp.HasField("temperature") else DEFAULT_TEMPERATURE,
        "top_p": sp.top_p or 1.0,
        "top_k": sp.top_k,
        "min_p": sp.min_p,
        "frequency_penalty": sp.frequency_penalty,
        "presence_penalty": sp.presence_penalty,
        "repetition_penalty": sp.repetition_penalty or 1.0,
        "max_tokens": sp.max_tokens if sp.HasField("max_tokens") else None,
        "min_tokens": sp.min_tokens,
        "stop": list(sp.stop) or None,
        "stop_token_ids": list(sp.stop_token_ids) or None,
        "skip_special_tokens": sp.skip_special_tokens,
        "spaces_between_special_tokens": sp.spaces_between_special_tokens,
        "ignore_eos": sp.ignore_eos,
        "include_stop_str_in_output": sp.include_stop_str_in_output,
        "logprobs": sp.logprobs if sp.HasField("logprobs") else None,
        "prompt_logprobs": sp.prompt_logprobs if sp.HasField("prompt_logprobs") else None,
        "seed": sp.seed if sp.HasField("seed") else None,
        "logit_bias": dict(sp.logit_bias) or None,
        # Text is only needed to match stop strings; the router detokenizes itself.
        "detokenize": bool(sp.stop),
    }
    tokenization = None
    if sp.HasField("truncate_prompt_tokens"):
        tokenization = {"truncate_prompt_tokens": sp.truncate_prompt_tokens}
    return SamplingSpec(kwargs=kwargs, structured=_structured(sp), tokenization=tokenization)


def kv_transfer_params(request: pb.GenerateRequest) -> dict[str, Any] | None:
    """The request's KV-transfer params: the JSON form wins over the legacy typed one."""
    if request.HasField("kv_transfer_params_json"):
        try:
            params = json.loads(request.kv_transfer_params_json)
        except ValueError as exc:
            raise InvalidRequest("kv_transfer_params_json is not valid JSON") from exc
        if not isinstance(params, dict):
            raise InvalidRequest("kv_transfer_params_json must be a JSON object")
        return params  # pyright: ignore[reportUnknownVariableType]
    legacy = request.kv_transfer_params
    if request.HasField("kv_transfer_params") and legacy.remote_host:
        if not (1 <= legacy.remote_port <= 65535):
            raise InvalidRequest("kv_transfer_params.remote_port must be in [1, 65535]")
        return {"remote_host": legacy.remote_host, "remote_port": legacy.remote_port}
    return None

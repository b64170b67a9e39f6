"""Proto ``GenerateRequest`` -> validated generation parameters. Pure: no MLX, no gRPC.

proto3 "unset" rules: ``temperature``, ``max_tokens``, ``logprobs`` and ``seed`` are ``optional``
(absent means the engine default); the plain scalars use 0 for "unset": ``top_p`` 0 -> 1.0,
``top_k`` 0 -> off, ``min_p`` 0 -> off, ``repetition_penalty`` 0 -> 1.0 (off), frequency and
presence penalties 0 -> off. Everything a client can get wrong raises :class:`InvalidRequest`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import mlx_engine_pb2 as pb

DEFAULT_TEMPERATURE = 1.0
MAX_LOGPROBS = 20

Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class GenParams:
    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    logit_bias: dict[int, float]
    stop_token_ids: frozenset[int]
    logprobs: int  # 0 = none; N > 0 = sampled token plus top N
    want_logprobs: bool
    seed: int | None


def _prompt(
    request: pb.GenerateRequest, limits: ModelLimits, tokenize: Tokenize | None
) -> list[int]:
    kind = request.WhichOneof("input")
    if kind == "tokenized":
        ids = list(request.tokenized.input_ids)
    elif kind == "text" and tokenize is not None:
        ids = tokenize(request.text)
    else:
        raise InvalidRequest("the request has no input (tokenized or text)")
    if not ids:
        raise InvalidRequest("the prompt is empty")
    if max(ids) >= limits.vocab_size:
        raise InvalidRequest(f"token id {max(ids)} is outside the vocabulary ({limits.vocab_size})")
    if len(ids) >= limits.max_context:
        raise InvalidRequest(
            f"prompt of {len(ids)} tokens leaves no room in the context ({limits.max_context})"
        )
    return ids


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):
        raise InvalidRequest(f"{name} must be in [{low}, {high}], got {value}")


def to_params(
    request: pb.GenerateRequest, limits: ModelLimits, tokenize: Tokenize | None = None
) -> GenParams:
    prompt = _prompt(request, limits, tokenize)
    sp = request.sampling_params
    temperature = sp.temperature if sp.HasField("temperature") else DEFAULT_TEMPERATURE
    if temperature < 0:
        raise InvalidRequest(f"temperature must be >= 0, got {temperature}")
    if not (0.0 <= sp.top_p <= 1.0):
        raise InvalidRequest(f"top_p must be in (0, 1], got {sp.top_p}")
    _check_range("min_p", sp.min_p, 0.0, 1.0)
    _check_range("frequency_penalty", sp.frequency_penalty, -2.0, 2.0)
    _check_range("presence_penalty", sp.presence_penalty, -2.0, 2.0)
    if sp.repetition_penalty < 0:
        raise InvalidRequest(f"repetition_penalty must be > 0, got {sp.repetition_penalty}")
    room = limits.max_context - len(prompt)
    if sp.HasField("max_tokens"):
        if sp.max_tokens == 0:
            raise InvalidRequest("max_tokens must be at least 1")
        max_tokens = min(sp.max_tokens, room)
    else:
        max_tokens = room
    if sp.HasField("logprobs") and not (0 <= sp.logprobs <= MAX_LOGPROBS):
        raise InvalidRequest(f"logprobs must be in [0, {MAX_LOGPROBS}], got {sp.logprobs}")
    for token in (*sp.logit_bias.keys(), *sp.stop_token_ids):
        if not (0 <= token < limits.vocab_size):
            raise InvalidRequest(f"token id {token} is outside the vocabulary")
    stops = set(sp.stop_token_ids)
    if not sp.ignore_eos:
        stops.update(limits.eos_token_ids)
    return GenParams(
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=sp.top_p if sp.top_p > 0 else 1.0,
        top_k=sp.top_k,
        min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty if sp.repetition_penalty > 0 else 1.0,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        logit_bias=dict(sp.logit_bias),
        stop_token_ids=frozenset(stops),
        logprobs=sp.logprobs if sp.HasField("logprobs") else 0,
        want_logprobs=sp.HasField("logprobs"),
        seed=sp.seed if sp.HasField("seed") else None,
    )

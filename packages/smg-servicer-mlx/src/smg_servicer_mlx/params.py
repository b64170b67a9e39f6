"""Proto ``GenerateRequest`` -> validated generation parameters. Pure: no MLX, no gRPC.

proto3 "unset" rules: ``temperature``, ``max_tokens``, ``logprobs`` and ``seed`` are ``optional``
(absent means the engine default); the plain scalars use 0 for "unset": ``top_p`` 0 -> 1.0,
``top_k`` 0 -> off (and a ``top_k`` of the vocabulary or more keeps every token, as on the
other engines: mlx-lm's filter refuses it, and the reliability fuzz saw that refusal end the engine
thread), ``min_p`` 0 -> off, ``repetition_penalty`` 0 -> 1.0 (off), frequency and
presence penalties 0 -> off. The shared rules (:mod:`smg_servicer_core.validate`) give the same
messages as on every engine; a ``max_tokens`` past the context is clamped to what it leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from smg_servicer_core import validate
from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import mlx_engine_pb2 as pb

DEFAULT_TEMPERATURE = 1.0
#: The engine's finish reason for a request whose sampling could not be set up (it never entered
#: the batch; the servicer answers INTERNAL and the engine goes on).
UNSERVABLE = "unservable"

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
    validate.prompt(ids, limits.vocab_size, limits.max_context)
    return ids


def to_params(
    request: pb.GenerateRequest, limits: ModelLimits, tokenize: Tokenize | None = None
) -> GenParams:
    prompt = _prompt(request, limits, tokenize)
    sp = request.sampling_params
    temperature = sp.temperature if sp.HasField("temperature") else DEFAULT_TEMPERATURE
    validate.sampling(validate.Sampling.of(sp))
    validate.max_tokens(sp.max_tokens if sp.HasField("max_tokens") else None)
    validate.logprob_count("logprobs", sp.logprobs if sp.HasField("logprobs") else None)
    room = limits.max_context - len(prompt)
    max_tokens = min(sp.max_tokens, room) if sp.HasField("max_tokens") else room
    for token in (*sp.logit_bias.keys(), *sp.stop_token_ids):
        if not (0 <= token < limits.vocab_size):
            raise InvalidRequest(
                f"token id {token} is outside the vocabulary (size {limits.vocab_size})"
            )
    stops = set(sp.stop_token_ids)
    if not sp.ignore_eos:
        stops.update(limits.eos_token_ids)
    return GenParams(
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=sp.top_p if sp.top_p > 0 else 1.0,
        top_k=sp.top_k if sp.top_k < limits.vocab_size else 0,
        min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty if sp.repetition_penalty > 0 else 1.0,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        logit_bias=dict(sp.logit_bias),
        stop_token_ids=frozenset(stops),
        logprobs=sp.logprobs if sp.HasField("logprobs") else 0,
        want_logprobs=sp.HasField("logprobs"),
        # The wire's seed is an int32; MLX keys take non-negative ones (a negative seed raised
        # in the engine thread): its two's-complement bits keep every seed distinct.
        seed=sp.seed & 0xFFFFFFFF if sp.HasField("seed") else None,
    )

"""Request rules every engine applies, one message per rule (the same text on every engine).

Pure functions over plain values, so each engine's conversion module calls them with whatever its
wire calls the field (``max_tokens`` on vLLM and MLX, ``max_new_tokens`` on SGLang). Each raises
:class:`~smg_servicer_core.errors.InvalidRequest` (INVALID_ARGUMENT) with the message below.

| rule | message |
|---|---|
| empty prompt | ``the prompt is empty`` |
| token id outside the vocabulary | ``token id {id} is outside the vocabulary (size {vocab})`` |
| prompt fills the context | ``the prompt has {n} tokens; the context holds {context}`` |
| ``max_tokens`` < 1 | ``max_tokens must be at least 1, got {n}`` |
| temperature < 0 or not finite | ``temperature must be a finite number >= 0, got {t}`` |
| ``top_p`` outside (0, 1] | ``top_p must be in (0, 1], got {p}`` |
| ``top_k`` below -1 | ``top_k must be -1 or 0 (off) or positive, got {k}`` |
| ``min_p`` outside [0, 1] | ``min_p must be in [0, 1], got {p}`` |
| frequency / presence penalty outside [-2, 2] | ``{name} must be in [-2, 2], got {v}`` |
| repetition penalty < 0 | ``repetition_penalty must be > 0, got {v}`` |
| logprob count outside [0, 20] | ``{name} must be in [0, 20], got {n}`` |
| ``n`` above 128 | ``n must be at most 128, got {n}`` |

proto3 cannot tell an unset scalar from zero, so ``top_p`` 0 and ``repetition_penalty`` 0 mean
"unset" (1.0) and pass; an explicit ``max_tokens`` 0 is always refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smg_servicer_core.errors import InvalidRequest

MAX_LOGPROBS = 20
#: The most choices (``n``) one request may ask for: each is a request in the engine.
MAX_CHOICES = 128


def prompt(ids: Sequence[int], vocab_size: int, context_length: int) -> None:
    """A prompt of token ids: not empty, inside the vocabulary, leaving room in the context."""
    why = prompt_refusal(ids, vocab_size, context_length)
    if why:
        raise InvalidRequest(why)


def prompt_refusal(
    ids: Sequence[int] | Any, vocab_size: int, context_length: int, *, length: int = 0
) -> str:
    """Why a prompt is refused (empty: it is not), by the rules of :func:`prompt`: the one prompt
    guard of every lane, the Python gRPC lanes (:func:`prompt`) and the launchers of the router's
    ZMQ lane, which check the requests the router sends straight to an engine (vLLM's engine
    core, SGLang's scheduler, TokenSpeed's ranks). The same prompt gets the same answer and the
    same words on every lane and engine.

    ``ids`` is a sequence of token ids or an array with ``min``/``max`` (vLLM 0.34's int32
    ndarray), or None; ``length`` is the prompt's length when it comes as embeddings (no ids:
    only its length is checked). A prompt must leave room for one token: ``len >=
    context_length`` is refused (the engine could only end it at once); a ``context_length`` of
    0 is unknown (an engine that registered none) and not checked."""
    count = 0 if ids is None else len(ids)
    size = count or length
    if not size:
        return "the prompt is empty"
    if count:
        low, high = _bounds(ids)
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            return f"token id {bad} is outside the vocabulary (size {vocab_size})"
    if 0 < context_length <= size:
        return f"the prompt has {size} tokens; the context holds {context_length}"
    return ""


def _bounds(ids: Any) -> tuple[int, int]:
    """The smallest and largest id (a sequence, or an array: its own ``min``/``max``, one pass in
    C, else Python's)."""
    if hasattr(ids, "min") and hasattr(ids, "max"):
        return int(ids.min()), int(ids.max())
    return int(min(ids)), int(max(ids))


def choices(n: int) -> int:
    """``n`` as sent (0: unset, one choice) -> the number of choices, at most :data:`MAX_CHOICES`
    (the reliability fuzz found an SGLang worker building 2**31 requests for one ``n``)."""
    if n > MAX_CHOICES:
        raise InvalidRequest(f"n must be at most {MAX_CHOICES}, got {n}")
    return max(n, 1)


def max_tokens(value: int | None) -> None:
    """An explicit output budget must be at least one token (None: not sent). How a budget past
    the context is treated (clamped or refused) is the engine's own rule."""
    if value is not None and value < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {value}")


@dataclass(frozen=True)
class Sampling:
    """The sampling values every wire has, as the request sent them (None: not on the wire)."""

    temperature: float | None = None
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 0.0

    @classmethod
    def of(cls, params: Any) -> Sampling:
        """The values of a wire's ``SamplingParams`` message (every wire names them alike);
        an ``optional`` temperature that is unset reads None."""
        field = params.DESCRIPTOR.fields_by_name["temperature"]
        unset = field.has_presence and not params.HasField("temperature")
        return cls(
            temperature=None if unset else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            repetition_penalty=params.repetition_penalty,
        )


def _finite(name: str, value: float, rule: str) -> None:
    if not math.isfinite(value):
        raise InvalidRequest(f"{name} must be {rule}, got {value}")


def sampling(values: Sampling) -> None:
    """The sampling rules of the table above."""
    t = values.temperature
    if t is not None and (not math.isfinite(t) or t < 0):
        raise InvalidRequest(f"temperature must be a finite number >= 0, got {t}")
    _finite("top_p", values.top_p, "in (0, 1]")
    if not 0.0 <= values.top_p <= 1.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {values.top_p}")
    if values.top_k < -1:
        raise InvalidRequest(f"top_k must be -1 or 0 (off) or positive, got {values.top_k}")
    _finite("min_p", values.min_p, "in [0, 1]")
    if not 0.0 <= values.min_p <= 1.0:
        raise InvalidRequest(f"min_p must be in [0, 1], got {values.min_p}")
    for name in ("frequency_penalty", "presence_penalty"):
        value: float = getattr(values, name)
        _finite(name, value, "in [-2, 2]")
        if not -2.0 <= value <= 2.0:
            raise InvalidRequest(f"{name} must be in [-2, 2], got {value}")
    _finite("repetition_penalty", values.repetition_penalty, "> 0")
    if values.repetition_penalty < 0:
        raise InvalidRequest(f"repetition_penalty must be > 0, got {values.repetition_penalty}")


def logprob_count(name: str, value: int | None) -> None:
    """A number of top logprobs (``logprobs``, ``prompt_logprobs``, ``top_logprobs_num``)."""
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise InvalidRequest(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")

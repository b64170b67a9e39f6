"""The invalid requests every engine must refuse with the same status and message.

    await assert_refused_alike(stub, "vllm", vocab_size=vocab, context_length=context)

One entry per rule of :mod:`smg_servicer_core.validate`; each engine's tests run the whole table
against the real engine, so the messages cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from smg_servicer_core.testing.requests import WIRES, Wire, generate_request

Ids = Callable[[int, int], list[int]]


@dataclass(frozen=True)
class BadRequest:
    name: str
    #: The message, formatted with ``vocab`` and ``context``.
    template: str
    ids: Ids = lambda vocab, context: [1, 2, 3]
    sampling: dict[str, Any] = field(default_factory=dict[str, Any])
    max_tokens: int | None = 4
    #: The wires that can carry the case (vLLM's and MLX's ``top_k`` is unsigned).
    wires: tuple[Wire, ...] = ("mlx", "vllm", "sglang", "tokenspeed")

    def applies_to(self, wire: Wire) -> bool:
        return wire in self.wires

    def request(self, wire: Wire, *, vocab_size: int, context_length: int) -> Any:
        sampling = dict(self.sampling)
        logprobs = sampling.pop("logprobs", None)
        request = generate_request(
            wire, self.ids(vocab_size, context_length), max_tokens=self.max_tokens, **sampling
        )
        if logprobs is not None:
            module, _ = WIRES[wire]
            if "top_logprobs_num" in module.GenerateRequest.DESCRIPTOR.fields_by_name:
                request.return_logprob = True
                request.top_logprobs_num = logprobs
            else:
                request.sampling_params.logprobs = logprobs
        return request

    def message(self, *, vocab_size: int, context_length: int) -> str:
        return self.template.format(vocab=vocab_size, context=context_length)


BAD_REQUESTS: tuple[BadRequest, ...] = (
    BadRequest("empty prompt", "the prompt is empty", ids=lambda v, c: []),
    BadRequest(
        "token outside the vocabulary",
        "token id {vocab} is outside the vocabulary (size {vocab})",
        ids=lambda v, c: [1, v],
    ),
    BadRequest(
        "prompt fills the context",
        "the prompt has {context} tokens; the context holds {context}",
        ids=lambda v, c: [1] * c,
    ),
    BadRequest("max_tokens 0", "max_tokens must be at least 1, got 0", max_tokens=0),
    BadRequest(
        "negative temperature",
        "temperature must be a finite number >= 0, got -1.0",
        sampling={"temperature": -1.0},
    ),
    BadRequest("top_p above 1", "top_p must be in (0, 1], got 1.5", sampling={"top_p": 1.5}),
    BadRequest(
        "top_k below -1",
        "top_k must be -1 or 0 (off) or positive, got -2",
        sampling={"top_k": -2},
        wires=("sglang", "tokenspeed"),
    ),
    BadRequest("min_p above 1", "min_p must be in [0, 1], got 2.0", sampling={"min_p": 2.0}),
    BadRequest(
        "frequency penalty above 2",
        "frequency_penalty must be in [-2, 2], got 3.0",
        sampling={"frequency_penalty": 3.0},
    ),
    BadRequest(
        "presence penalty below -2",
        "presence_penalty must be in [-2, 2], got -3.0",
        sampling={"presence_penalty": -3.0},
    ),
    BadRequest(
        "negative repetition penalty",
        "repetition_penalty must be > 0, got -1.0",
        sampling={"repetition_penalty": -1.0},
    ),
    BadRequest("21 logprobs", "logprobs must be in [0, 20], got 21", sampling={"logprobs": 21}),
)


async def assert_refused_alike(
    stub: Any, wire: Wire, *, vocab_size: int, context_length: int
) -> int:
    """Send every case that ``wire`` can carry; each must end INVALID_ARGUMENT with its message
    and nothing streamed. Returns how many cases ran."""
    ran = 0
    for case in BAD_REQUESTS:
        if not case.applies_to(wire):
            continue
        request = case.request(wire, vocab_size=vocab_size, context_length=context_length)
        received: list[Any] = []
        status: tuple[Any, Any] = (grpc.StatusCode.OK, "")
        try:
            async for message in stub.Generate(request):
                received.append(message)
        except grpc.aio.AioRpcError as err:
            status = (err.code(), err.details())
        want = case.message(vocab_size=vocab_size, context_length=context_length)
        assert status == (grpc.StatusCode.INVALID_ARGUMENT, want), (case.name, status)
        assert not received, case.name
        ran += 1
    return ran

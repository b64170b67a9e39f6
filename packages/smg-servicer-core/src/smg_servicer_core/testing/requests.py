"""Proto request builders for tests and the bench, one table entry per wire the router speaks."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Literal

from smg_servicer_core.proto import (
    mlx_engine_pb2,
    mlx_engine_pb2_grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

Wire = Literal["mlx", "vllm", "sglang", "tokenspeed"]

#: wire -> (generated module, name of the max-tokens field)
WIRES: dict[str, tuple[ModuleType, str]] = {
    "mlx": (mlx_engine_pb2, "max_tokens"),
    "vllm": (vllm_engine_pb2, "max_tokens"),
    "sglang": (sglang_scheduler_pb2, "max_new_tokens"),
    "tokenspeed": (tokenspeed_scheduler_pb2, "max_new_tokens"),
}

#: wire -> the generated client stub of its engine service (``STUBS[wire](channel)``)
STUBS: dict[str, Any] = {
    "mlx": mlx_engine_pb2_grpc.MlxEngineStub,  # pyright: ignore[reportUnknownMemberType]
    "vllm": vllm_engine_pb2_grpc.VllmEngineStub,  # pyright: ignore[reportUnknownMemberType]
    "sglang": sglang_scheduler_pb2_grpc.SglangSchedulerStub,  # pyright: ignore[reportUnknownMemberType]
    "tokenspeed": tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub,  # pyright: ignore[reportUnknownMemberType]
}

#: wire -> the engine service's full name (what ``grpc.health.v1`` is asked about)
SERVICES: dict[str, str] = {
    "mlx": "mlx.grpc.engine.MlxEngine",
    "vllm": "vllm.grpc.engine.VllmEngine",
    "sglang": "sglang.grpc.scheduler.SglangScheduler",
    "tokenspeed": "tokenspeed.grpc.scheduler.TokenSpeedScheduler",
}

_counter = itertools.count()


def next_request_id(prefix: str = "test") -> str:
    return f"{prefix}-{next(_counter)}"


def generate_request(
    wire: Wire,
    input_ids: Sequence[int],
    *,
    max_tokens: int | None = 16,
    stream: bool = False,
    request_id: str | None = None,
    **sampling: Any,
) -> Any:
    """A tokenized ``GenerateRequest`` for ``wire``; ``sampling`` sets SamplingParams fields."""
    module, max_field = WIRES[wire]
    params = module.SamplingParams(**sampling)
    if max_tokens is not None:
        setattr(params, max_field, max_tokens)
    return module.GenerateRequest(
        request_id=request_id or next_request_id(),
        tokenized=module.TokenizedInput(input_ids=list(input_ids)),
        sampling_params=params,
        stream=stream,
    )


def mlx_generate(input_ids: Sequence[int], **kwargs: Any) -> mlx_engine_pb2.GenerateRequest:
    request: mlx_engine_pb2.GenerateRequest = generate_request("mlx", input_ids, **kwargs)
    return request

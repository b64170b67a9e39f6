"""A complete SMG servicer over :class:`FakeEngine`, serving the MLX wire (``MlxEngine``).

It is the reference use of core's plumbing (registry, errors, tokenizer bundle, health, load
tracker) with nothing engine-specific in the way, which is what the contract tests and
``tools/bench`` drive. The MLX service is used because it is the smallest generation contract the
router speaks; an engine package's own servicer follows the same recipe.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc.aio

from smg_servicer_core.errors import Aborted, InvalidRequest, grpc_errors
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.loads import LoadTracker
from smg_servicer_core.proto import mlx_engine_pb2, mlx_engine_pb2_grpc
from smg_servicer_core.registry import RequestRegistry
from smg_servicer_core.rpcs import CommonRpcs
from smg_servicer_core.server import ServiceBinding, bind_servicer
from smg_servicer_core.testing.fake_engine import FakeEngine
from smg_servicer_core.tokenizer_bundle import TokenizerBundleCache

pb = mlx_engine_pb2
Context = grpc.aio.ServicerContext[Any, Any]

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["MlxEngine"].full_name


def validate_prompt(request: pb.GenerateRequest, vocab_size: int, max_context: int) -> list[int]:
    if request.WhichOneof("input") != "tokenized":
        raise InvalidRequest("this servicer takes tokenized input only")
    ids = list(request.tokenized.input_ids)
    if not ids:
        raise InvalidRequest("the prompt is empty")
    if max(ids) >= vocab_size:
        raise InvalidRequest(f"token id {max(ids)} is outside the vocabulary ({vocab_size})")
    if len(ids) >= max_context:
        raise InvalidRequest(f"prompt of {len(ids)} tokens exceeds the context ({max_context})")
    return ids


class FakeEngineServicer(CommonRpcs, mlx_engine_pb2_grpc.MlxEngineServicer):
    wire = pb

    def __init__(
        self, engine: FakeEngine, health: HealthFrame, tokenizer_path: str | Path | None = None
    ) -> None:
        self.engine = engine
        self.health = health
        self.tokenizer_path = tokenizer_path
        self.registry = RequestRegistry(engine.abort)
        self.bundles = TokenizerBundleCache()
        self.loads = LoadTracker()
        self.started = time.monotonic()

    def binding(self) -> ServiceBinding:
        add = mlx_engine_pb2_grpc.add_MlxEngineServicer_to_server  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        return bind_servicer(SERVICE_NAME, add, self)  # pyright: ignore[reportUnknownArgumentType]

    @grpc_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        prompt = validate_prompt(request, self.engine.vocab_size, self.engine.max_context)
        params = request.sampling_params
        room = self.engine.max_context - len(prompt)
        max_tokens = min(params.max_tokens, room) if params.HasField("max_tokens") else room
        stops = list(params.stop_token_ids)
        output: list[int] = []
        finish, matched = "length", None
        async with self.registry.track(request.request_id) as handle:
            async for step in self.engine.generate(request.request_id, prompt, max_tokens, stops):
                output.extend(step.token_ids)
                if request.stream and step.token_ids:
                    self.loads.record_tokens(len(step.token_ids))
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(
                            token_ids=step.token_ids,
                            prompt_tokens=len(prompt),
                            completion_tokens=len(output),
                        )
                    )
                if step.finish_reason is not None:
                    finish, matched = step.finish_reason, step.matched_stop_token_id
            if handle.aborted:
                raise Aborted(f"request {request.request_id} was aborted ({handle.abort_reason})")
        if not request.stream:
            self.loads.record_tokens(len(output))
        yield pb.GenerateResponse(
            complete=pb.GenerateComplete(
                output_ids=output if not request.stream else [],
                finish_reason=finish,
                prompt_tokens=len(prompt),
                completion_tokens=len(output),
                matched_stop_token_id=matched,
            )
        )

    def not_ready_reason(self) -> str | None:
        return None if self.engine.ready else "engine starting"

    def tokenizer_dir(self) -> str | Path | None:
        return self.tokenizer_path

    @grpc_errors
    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Context
    ) -> pb.GetModelInfoResponse:
        path = str(self.tokenizer_path or "fake-model")
        return pb.GetModelInfoResponse(
            model_path=path,
            served_model_name=path,
            is_generation=True,
            max_context_length=self.engine.max_context,
            max_req_input_len=self.engine.max_context,
            vocab_size=self.engine.vocab_size,
            model_type="fake",
            architectures=["FakeForCausalLM"],
            eos_token_ids=list(self.engine.eos_token_ids),
        )

    @grpc_errors
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            server_type="fake-grpc",
            active_requests=len(self.registry),
            uptime_seconds=time.monotonic() - self.started,
        )

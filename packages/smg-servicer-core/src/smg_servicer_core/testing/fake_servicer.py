"""A complete SMG servicer over :class:`FakeEngine`, serving the MLX wire (``MlxEngine``).

It is the reference use of core's plumbing (registry, errors, tokenizer bundle, health, load
tracker) with nothing engine-specific in the way, which is what the contract tests and
``tools/bench`` drive. The MLX service is used because it is the smallest generation contract the
router speaks; an engine package's own servicer follows the same recipe.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc.aio

from smg_servicer_core import validate
from smg_servicer_core.errors import Aborted, InvalidRequest, grpc_errors
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.loads import LoadTracker
from smg_servicer_core.metrics import EngineLoad, LoadsSource, ServicerMetrics
from smg_servicer_core.proto import mlx_engine_pb2, mlx_engine_pb2_grpc
from smg_servicer_core.servicer import EngineServicer
from smg_servicer_core.testing.fake_engine import FakeEngine

pb = mlx_engine_pb2
Context = grpc.aio.ServicerContext[Any, Any]

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["MlxEngine"].full_name


def validate_prompt(request: pb.GenerateRequest, vocab_size: int, max_context: int) -> list[int]:
    if request.WhichOneof("input") != "tokenized":
        raise InvalidRequest("this servicer takes tokenized input only")
    ids = list(request.tokenized.input_ids)
    validate.prompt(ids, vocab_size, max_context)
    return ids


class FakeEngineServicer(EngineServicer, mlx_engine_pb2_grpc.MlxEngineServicer):
    wire = pb
    wire_grpc = mlx_engine_pb2_grpc
    service = "MlxEngine"

    def __init__(
        self,
        engine: FakeEngine,
        health: HealthFrame,
        tokenizer_path: str | Path | None = None,
        metrics: ServicerMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer_path = tokenizer_path
        self.loads = LoadTracker()
        super().__init__(health=health, metrics=metrics)

    async def engine_abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def engine_loads(self) -> LoadsSource | None:
        def read() -> list[EngineLoad]:
            return [EngineLoad(running=len(self.registry), waiting=0, kv_cache_usage=0.0)]

        return read

    @grpc_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        prompt = validate_prompt(request, self.engine.vocab_size, self.engine.max_context)
        params = request.sampling_params
        validate.max_tokens(params.max_tokens if params.HasField("max_tokens") else None)
        validate.sampling(validate.Sampling.of(params))
        validate.logprob_count("logprobs", params.logprobs if params.HasField("logprobs") else None)
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

    async def probe(self) -> str | None:
        if self.engine.unhealthy is not None:
            return self.engine.unhealthy
        return None if self.engine.ready else "engine starting"

    def tokenizer_dir(self) -> str | Path | None:
        return self.tokenizer_path

    def model_facts(self) -> ModelFacts:
        path = str(self.tokenizer_path or "fake-model")
        return ModelFacts(
            model_path=path,
            vocab_size=self.engine.vocab_size,
            max_context_length=self.engine.max_context,
            model_type="fake",
            architectures=("FakeForCausalLM",),
            eos_token_ids=tuple(self.engine.eos_token_ids),
        )

    @grpc_errors
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            server_type="fake-grpc",
            active_requests=len(self.registry),
            uptime_seconds=self.uptime_s(),
        )

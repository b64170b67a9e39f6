"""``mlx.grpc.engine.MlxEngine`` over :class:`~smg_servicer_mlx._engine.MlxEngine`.

Each RPC is validate -> convert -> engine -> convert back. Streaming sends a chunk per decode
step (one token, or every token already waiting when the reader fell behind;
``completion_tokens`` cumulative), then one ``complete`` with empty ``output_ids``;
non-streaming sends one ``complete`` with every id. An aborted request ends with status ABORTED,
never a silent truncation; an engine failure mid-request ends with INTERNAL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc.aio

from smg_servicer_core.errors import Aborted, ServicerError, Unavailable, grpc_errors
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineLoad, LoadsSource, ServicerMetrics
from smg_servicer_core.proto import mlx_engine_pb2 as pb
from smg_servicer_core.proto import mlx_engine_pb2_grpc
from smg_servicer_core.servicer import EngineServicer
from smg_servicer_mlx.params import UNSERVABLE, GenParams, ModelLimits, to_params

if TYPE_CHECKING:
    from smg_servicer_mlx._engine import MlxEngine, StepOutput

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["MlxEngine"].full_name
SERVER_TYPE = "mlx-grpc"


class EngineFailed(Unavailable):
    """The engine thread ended while the request ran (UNAVAILABLE, as every engine's death: the
    worker is going away, and the router retries the request on another)."""


class SamplingFailed(ServicerError):
    """The engine could not set up this request's sampling; the engine itself goes on (INTERNAL)."""


def _logprobs(outputs: list[StepOutput]) -> pb.OutputLogProbs:
    return pb.OutputLogProbs(
        token_logprobs=[o.logprob or 0.0 for o in outputs],
        token_ids=[o.token for o in outputs if o.token is not None],
        top_logprobs=[
            pb.TopLogProbs(values=[v for _, v in o.top], token_ids=[i for i, _ in o.top])
            for o in outputs
        ],
    )


class MlxServicer(EngineServicer, mlx_engine_pb2_grpc.MlxEngineServicer):
    wire = pb
    wire_grpc = mlx_engine_pb2_grpc
    service = "MlxEngine"

    def __init__(
        self, engine: MlxEngine, health: HealthFrame, metrics: ServicerMetrics | None = None
    ) -> None:
        self.engine = engine
        info = engine.info
        self.limits = ModelLimits(info.vocab_size, info.max_context, info.eos_token_ids)
        super().__init__(health=health, metrics=metrics)

    async def engine_abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def engine_loads(self) -> LoadsSource | None:
        def read() -> list[EngineLoad]:
            running, waiting = self.engine.load()
            return [EngineLoad(running=running, waiting=waiting, kv_cache_usage=0.0)]

        return read

    @grpc_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        params = to_params(request, self.limits, self.engine.tokenize)
        outputs: list[StepOutput] = []
        finish = "length"
        async with self.registry.track(request.request_id) as handle:
            async for batch in self.engine.generate(request.request_id, params):
                tokens = [o for o in batch if o.token is not None]
                if tokens:
                    outputs.extend(tokens)
                    if request.stream:
                        yield self._chunk(params, tokens, len(outputs))
                if batch[-1].finish_reason is not None:
                    finish = batch[-1].finish_reason
            if handle.aborted or finish == "abort":
                raise Aborted(f"request {request.request_id} was aborted")
        if finish == "error":
            raise EngineFailed("the MLX engine stopped while generating; retry elsewhere")
        if finish == UNSERVABLE:
            raise SamplingFailed("the engine could not set up this request's sampling")
        yield self._complete(request, params, outputs, finish)

    def _chunk(
        self, params: GenParams, outputs: list[StepOutput], count: int
    ) -> pb.GenerateResponse:
        chunk = pb.GenerateStreamChunk(
            token_ids=[o.token or 0 for o in outputs],
            prompt_tokens=len(params.prompt),
            completion_tokens=count,
        )
        if params.want_logprobs:
            chunk.output_logprobs.CopyFrom(_logprobs(outputs))
        return pb.GenerateResponse(chunk=chunk)

    def _complete(
        self,
        request: pb.GenerateRequest,
        params: GenParams,
        outputs: list[StepOutput],
        finish: str,
    ) -> pb.GenerateResponse:
        last = outputs[-1].token if outputs else None
        complete = pb.GenerateComplete(
            output_ids=[] if request.stream else [o.token or 0 for o in outputs],
            finish_reason=finish,
            prompt_tokens=len(params.prompt),
            completion_tokens=len(outputs),
        )
        if finish == "stop" and last is not None and last in params.stop_token_ids:
            complete.matched_stop_token_id = last
        if params.want_logprobs and not request.stream:
            complete.output_logprobs.CopyFrom(_logprobs(outputs))
        return pb.GenerateResponse(complete=complete)

    async def probe(self) -> str | None:
        if self.engine.dead:
            return "engine thread stopped"
        return None if self.engine.ready else "loading model"

    def tokenizer_dir(self) -> str | None:
        return self.engine.info.path

    def model_facts(self) -> ModelFacts:
        info = self.engine.info
        return ModelFacts(
            model_path=info.name or info.path,
            vocab_size=info.vocab_size,
            max_context_length=info.max_context,
            model_type=info.model_type,
            architectures=info.architectures,
            eos_token_ids=info.eos_token_ids,
            pad_token_id=info.pad_token_id,
            bos_token_id=info.bos_token_id,
        )

    @grpc_errors
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            server_type=SERVER_TYPE,
            active_requests=len(self.registry),
            uptime_seconds=self.uptime_s(),
        )

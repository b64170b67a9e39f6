"""``sglang.grpc.scheduler.SglangScheduler`` over the :class:`RequestManager`.

Generate streams one ``chunk`` per scheduler output that carries tokens (``token_ids`` is the
delta; counts are cumulative, as SGLang reports them), then one ``complete`` with the finish
reason and final counts and empty ``output_ids`` (every id went out in chunks). Non-streaming
sends one ``complete`` with every id and all logprobs. ``n > 1`` tags each choice with ``index``.

A request stopped by ``Abort`` or by the client ends with ``complete{finish_reason: "abort"}``;
one the scheduler refused ends with the status its HTTP code maps to and the scheduler's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc.aio
from google.protobuf import struct_pb2, timestamp_pb2

from smg_servicer_core import tracing
from smg_servicer_core.errors import (
    InvalidRequest,
    ServicerError,
    Unavailable,
    Unsupported,
    grpc_errors,
)
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineLoad, LoadsSource, ServicerMetrics, rank_loads
from smg_servicer_core.proto import common_pb2, sglang_scheduler_pb2_grpc
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.servicer import EngineServicer
from smg_servicer_kv_bridge import subscription
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang import convert, grammar, images, kv_events, loads, lora
from smg_servicer_sglang.convert import ModelLimits, Output
from smg_servicer_sglang.request_manager import RequestManager

logger = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["SglangScheduler"].full_name
SERVER_TYPE = "grpc"
HEALTH_PROBE_PREFIX = "HEALTH_CHECK_"
#: The deep probe's wait (SGLang's ``SGLANG_HEALTH_CHECK_TIMEOUT`` default) and poll step.
HEALTH_TIMEOUT_S = 20.0
HEALTH_POLL_S = 0.5
FLUSH_MIN_TIMEOUT_S = 30.0
PROFILE_TIMEOUT_S = 600.0
_KV_OFF = (
    "KV events are off: start SGLang with --kv-events-config "
    '\'{"publisher": "zmq", "endpoint": "tcp://*:5557"}\' to enable them; '
    "the router falls back to GetLoads"
)
_DEFAULT_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    result = struct_pb2.Struct()
    result.update(json.loads(json.dumps(value, default=str)))
    return result


class SglangServicer(EngineServicer, sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    wire = pb
    wire_grpc = sglang_scheduler_pb2_grpc
    service = "SglangScheduler"

    def __init__(
        self,
        manager: RequestManager,
        *,
        server_args: Any,
        config: Any,
        scheduler_info: dict[str, Any],
        facts: dict[str, Any],
        health: HealthFrame,
        tokenizer: Any = None,
        load_reader: Any = None,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        metrics: ServicerMetrics | None = None,
        adapters: lora.Adapters | None = None,
        request_traces: bool = False,
        encoder: sg.EncoderSide | None = None,
    ) -> None:
        self.manager = manager
        #: A language-only worker's encoder side (``--language-only``): its pictures go to
        #: SGLang's encoders (:func:`_sglang.dispatch_images`).
        self.encoder = encoder
        #: Encoder dispatch errors on their way to the scheduler (kept until sent).
        self._forwarding: set[asyncio.Task[None]] = set()
        #: SGLang's own request tracing is on (``--enable-trace``): a request that carries trace
        #: context hands it to SGLang's scheduler spans (:class:`_sglang.RequestTrace`).
        self.request_traces = request_traces
        #: LoRA adapters (:mod:`.lora`): SGLang's registry, loads and unloads.
        self.adapters = adapters if adapters is not None else lora.Adapters.of(config, manager)
        self.server_args = server_args
        self.config = config
        self.scheduler_info = scheduler_info
        self.facts = facts
        self.tokenizer = tokenizer
        self.load_reader = load_reader
        self.health_timeout_s = health_timeout_s
        self.limits = ModelLimits(
            vocab_size=int(facts["vocab_size"]),
            context_length=int(facts["context_length"]),
            is_generation=bool(facts["is_generation"]),
            dp_size=max(int(getattr(manager, "dp_size", 1)), 1),
            needs_bootstrap=sg.needs_bootstrap(config),
            images=facts.get("image_rules"),
            encoder_image_token=facts.get("encoder_image_token") if encoder else None,
            max_images=int(facts.get("max_images") or images.MAX_IMAGES),
        )
        #: The process watchdog's verdict (set by the launcher): a reason once a scheduler died.
        self.dead_reason: Callable[[], str | None] = lambda: None
        super().__init__(health=health, metrics=metrics)

    def attach_metrics(self, metrics: ServicerMetrics) -> None:
        super().attach_metrics(metrics)
        self.adapters.metrics = metrics
        if self.adapters.enabled:
            metrics.lora_adapters = self.adapters.count

    async def engine_abort(self, request_id: str) -> None:
        await self.manager.abort(request_id)

    def engine_loads(self) -> LoadsSource | None:
        def read() -> list[EngineLoad]:
            include = loads.sections([])
            return rank_loads(
                loads.scheduler_load(s, include) for s in loads.read(self.load_reader)
            )

        return read

    def _build(self, spec: convert.ReqSpec, adapter: tuple[str, str] | None = None) -> Any:
        return sg.build_generate(spec, self.limits.vocab_size, self.tokenizer, adapter)

    # -- Generate --------------------------------------------------------------------------

    @grpc_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        specs, prefix_spec = convert.generate_reqs(request, self.limits)
        if request.sampling_params.WhichOneof("constraint") == "ebnf_grammar":
            await grammar.refuse_dead_ends(request.sampling_params.ebnf_grammar)
        rid = request.request_id
        async with self.registry.track(rid), self.adapters.use(request.lora_id) as adapter:
            reqs = [self._build(spec, adapter) for spec in specs]
            traces = self._traces(reqs, context)
            if prefix_spec is None:
                trace = traces[0] if traces else None
                stream = self._single(request, reqs[0], trace, specs[0].image_urls)
            else:
                stream = self._parallel(request, reqs, self._build(prefix_spec, adapter))
            try:
                async with contextlib.aclosing(stream):  # its cleanup before the adapter's
                    async for message in stream:
                        yield message
            finally:
                for trace in traces:
                    with contextlib.suppress(Exception):  # observability never stops serving
                        trace.finish()

    def _traces(self, reqs: list[Any], context: Context) -> list[Any]:
        """SGLang's own request traces of ``reqs``, attached to them (none with SGLang's tracing
        off, or for a caller that sent no trace context)."""
        if not self.request_traces:
            return []
        headers = tracing.trace_headers(context.invocation_metadata())
        if headers is None:
            return []
        mode = sg.disaggregation_mode(self.config)
        try:
            traces = [sg.RequestTrace(req.rid, headers, mode) for req in reqs]
            for trace, req in zip(traces, reqs, strict=True):
                trace.attach(req)
        except Exception as exc:  # observability never stops serving
            self.request_traces = False
            logger.warning("SGLang's own request traces are off (%s)", type(exc).__name__)
            for req in reqs:
                req.time_stats = None
            return []
        return traces

    async def _single(
        self, request: pb.GenerateRequest, req: Any, trace: Any = None, urls: tuple[str, ...] = ()
    ) -> AsyncGenerator[pb.GenerateResponse]:
        rid = request.request_id
        self.manager.open([rid], stream=request.stream, grammar=_constrained(request))
        ready = None
        try:
            if urls:
                ready = self._dispatch_images(req, list(urls))
            try:
                await self.manager.send(req)
            finally:
                if ready is not None:  # a dispatch error may go to the scheduler now
                    ready.set()
            seen: list[Output] = []
            async for batch in self.manager.stream(rid):
                seen.extend(batch)
                final = batch[-1]
                if trace is not None and any(o.token_ids for o in batch):
                    trace.first_token()
                if (error := convert.failure(final.finish)) is not None:
                    raise error
                if request.stream and any(o.token_ids for o in batch):
                    yield pb.GenerateResponse(request_id=rid, chunk=convert.chunk(batch, 0))
                if final.finish is not None:
                    yield self._final(request, seen, final, 0)
        finally:
            await self.manager.release([rid])

    def _dispatch_images(self, req: Any, urls: list[str]) -> Any:
        """Send the request's pictures to SGLang's encoders; the event to set once it is sent.
        A dispatch that fails (an encoder's error, one that cannot be reached) reaches the
        scheduler as SGLang's ``EncoderDispatchErrorReq``, which ends the waiting request with
        the encoder's status."""
        if self.encoder is None:
            raise Unavailable("this worker has no encoder side")
        loop = asyncio.get_running_loop()
        open_now = self.manager.is_open

        async def forward(error: Any) -> None:
            if open_now(str(error.rid)):
                with contextlib.suppress(Unavailable):
                    await self.manager.send(error)

        def start(error: Any) -> None:
            task = loop.create_task(forward(error))
            self._forwarding.add(task)
            task.add_done_callback(self._forwarding.discard)

        def on_error(error: Any) -> None:  # on SGLang's encode thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
                loop.call_soon_threadsafe(start, error)

        ready = sg.dispatch_images(self.encoder, req, urls, on_error)
        if ready is None:
            raise Unavailable(
                "no encoder is registered with this language-only worker (--encoder-urls, or "
                "an encoder started with --encoder-register-urls)"
            )
        return ready

    async def _parallel(
        self, request: pb.GenerateRequest, reqs: list[Any], prefix: Any
    ) -> AsyncGenerator[pb.GenerateResponse]:
        rid = request.request_id
        rids = [r.rid for r in reqs]
        wake = self.manager.open(
            [prefix.rid, *rids], group=rid, stream=request.stream, grammar=_constrained(request)
        )
        try:
            if not await self._prefill(prefix):
                for index in range(len(rids)):
                    yield self._final(request, [], Output([], {"type": "abort"}), index)
                return
            for req in reqs:
                await self.manager.send(req)
            seen: list[list[Output]] = [[] for _ in rids]
            open_ids = set(range(len(rids)))
            while open_ids:
                wake.clear()
                for index in sorted(open_ids):
                    batch, _ = self.manager.take(rids[index])
                    if not batch:
                        continue
                    seen[index].extend(batch)
                    final = batch[-1]
                    if (error := convert.failure(final.finish)) is not None:
                        raise error
                    if request.stream and any(o.token_ids for o in batch):
                        yield pb.GenerateResponse(request_id=rid, chunk=convert.chunk(batch, index))
                    if final.finish is not None:
                        open_ids.discard(index)
                        yield self._final(request, seen[index], final, index)
                if open_ids and not any(self.manager.waiting(rids[i]) for i in open_ids):
                    await wake.wait()
        finally:
            await self.manager.release([prefix.rid, *rids], group=rid)

    async def _prefill(self, prefix: Any) -> bool:
        """Phase 1 of ``n > 1``: prefill the shared prompt once so the samples reuse its KV
        cache. False when it was aborted."""
        await self.manager.send(prefix)
        async for batch in self.manager.stream(prefix.rid):
            finish = batch[-1].finish
            if (error := convert.failure(finish)) is not None:
                raise error
            if convert.finish_reason(finish) == "abort":
                return False
        return True

    def _final(
        self, request: pb.GenerateRequest, seen: list[Output], final: Output, index: int
    ) -> pb.GenerateResponse:
        if request.stream:
            complete = convert.complete([], [], final, index)
            counts = next((o for o in reversed(seen) if o.prompt_tokens), None)
            if counts is not None:
                complete.prompt_tokens = counts.prompt_tokens
                complete.completion_tokens = counts.completion_tokens
                complete.cached_tokens = counts.cached_tokens
                complete.reasoning_tokens = counts.reasoning_tokens
        else:
            ids = [t for o in seen for t in o.token_ids]
            complete = convert.complete(ids, seen, final, index)
        return pb.GenerateResponse(request_id=request.request_id, complete=complete)

    # -- Embed -----------------------------------------------------------------------------

    @grpc_errors
    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        if self.limits.is_generation:
            raise Unsupported("this worker serves a generative model; Embed needs an embedding one")
        req = sg.build_embed(convert.embed_req(request, self.limits), self.tokenizer)
        rid = request.request_id
        async with self.registry.track(rid):
            self.manager.open([rid])
            try:
                await self.manager.send(req)
                outputs: list[Output] = []
                async for batch in self.manager.stream(rid):
                    outputs.extend(batch)
            finally:
                await self.manager.release([rid])
        final = outputs[-1]
        if (error := convert.failure(final.finish)) is not None:
            raise error
        if final.embedding is None:
            raise ServicerError(f"request {rid} ended without an embedding")
        return pb.EmbedResponse(
            embedding=final.embedding,
            embedding_dim=len(final.embedding),
            prompt_tokens=final.prompt_tokens,
        )

    # -- health, abort ---------------------------------------------------------------------

    async def probe(self) -> str | None:
        """The cheap probe (``grpc.health.v1`` and the first step of ``HealthCheck``): a dead
        scheduler, an unreadable scheduler stream, or a scheduler silent with requests pending."""
        dead = self.dead_reason() or self.manager.failed
        if dead:
            return dead
        if self.manager.stalled:
            return f"scheduler silent for {self.manager.stalled_for():.0f}s with requests pending"
        return None

    def tokenizer_dir(self) -> str | None:
        return self.config.tokenizer_path or None

    @grpc_errors
    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Context
    ) -> pb.HealthCheckResponse:
        """The deep probe: a one-token request must reach the scheduler and come back (or any
        scheduler output arrive meanwhile) within the probe timeout."""
        if (reason := await self.health.reason()) is not None:
            return pb.HealthCheckResponse(healthy=False, message=reason)
        healthy, message = await self._deep_probe()
        return pb.HealthCheckResponse(healthy=healthy, message=message)

    async def _deep_probe(self) -> tuple[bool, str]:
        rid = f"{HEALTH_PROBE_PREFIX}{uuid.uuid4().hex}"
        started = time.time()
        local = sg.local_only(self.config)
        req = sg.build_probe(rid, self.limits.is_generation, self.tokenizer, local)
        wake = self.manager.open([rid])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.health_timeout_s
        try:
            await self.manager.send(req)
            while True:
                outputs, finished = self.manager.take(rid)
                if outputs or finished:
                    error = convert.failure(outputs[-1].finish if outputs else None)
                    return (error is None, "OK" if error is None else "health probe failed")
                if self.manager.last_receive > started:
                    return True, "OK"
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return (
                        False,
                        f"the scheduler did not answer within {self.health_timeout_s:.0f}s",
                    )
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), min(HEALTH_POLL_S, remaining))
        except Unavailable:
            return False, "shutting down"
        finally:
            await self.manager.release([rid])

    @grpc_errors
    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortResponse:
        reason = request.reason or "aborted by request"
        if await self.registry.abort(request.request_id, reason):
            return pb.AbortResponse(success=True, message="aborted")
        return pb.AbortResponse(success=False, message="not found")

    # -- info ------------------------------------------------------------------------------

    def model_facts(self) -> ModelFacts:
        return model_facts(self.config, self.facts, self.scheduler_info)

    @grpc_errors
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        start = timestamp_pb2.Timestamp()
        start.FromSeconds(int(self.started_wall))
        return pb.GetServerInfoResponse(
            server_args=_struct(sg.settings(self.server_args, self.config)),
            scheduler_info=_struct(self.scheduler_info),
            active_requests=len(self.registry),
            # is_paused is left unset: SGLang's pause (/pause_generation) is its HTTP server's
            # tokenizer manager's, which gRPC mode does not run, and no RPC here pauses the
            # scheduler.
            last_receive_timestamp=self.manager.last_receive,
            uptime_seconds=self.uptime_s(),
            sglang_version=sg.SGLANG_VERSION,
            server_type=SERVER_TYPE,
            start_time=start,
            max_total_num_tokens=int(self.scheduler_info.get("max_total_num_tokens") or 0),
        )

    @grpc_errors
    async def GetLoads(self, request: pb.GetLoadsRequest, context: Context) -> pb.GetLoadsResponse:
        include = loads.sections(list(request.include))
        rank = request.dp_rank if request.HasField("dp_rank") else None
        if rank is not None and not 0 <= rank < self.manager.dp_size:
            raise InvalidRequest(f"dp_rank {rank} does not exist (ranks: {self.manager.dp_size})")
        snapshots = await asyncio.to_thread(loads.read, self.load_reader)
        rows = [loads.scheduler_load(s, include) for s in snapshots if rank in (None, s.dp_rank)]
        return pb.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(),
            version=sg.SGLANG_VERSION,
            dp_rank_count=len(rows),
            loads=rows,
            aggregate=loads.aggregate(rows),
        )

    # -- control ---------------------------------------------------------------------------

    @grpc_errors
    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: Context
    ) -> common_pb2.FlushCacheResponse:
        if request.timeout_s < 0:
            raise InvalidRequest("timeout_s must not be negative")
        timeout_s = request.timeout_s or None
        replies = await self.manager.control(
            sg.FlushCacheReqInput(timeout_s=timeout_s),
            sg.FlushCacheReqOutput,
            max(FLUSH_MIN_TIMEOUT_S, (timeout_s or 0.0) + 10.0),
        )
        return common_pb2.FlushCacheResponse(**_joined(replies, "cache flushed"))

    @grpc_errors
    async def StartProfile(
        self, request: common_pb2.StartProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        req = sg.ProfileReq(
            req_type=sg.ProfileReqType.START_PROFILE,
            output_dir=request.output_dir if request.HasField("output_dir") else None,
            start_step=request.start_step if request.HasField("start_step") else None,
            num_steps=request.num_steps if request.HasField("num_steps") else None,
            activities=list(request.activities) or None,
            with_stack=request.with_stack if request.HasField("with_stack") else True,
            record_shapes=request.record_shapes if request.HasField("record_shapes") else True,
            profile_by_stage=request.profile_by_stage,
            profile_id=str(time.time()),
        )
        replies = await self.manager.control(req, sg.ProfileReqOutput, PROFILE_TIMEOUT_S)
        return common_pb2.ProfileResponse(**_joined(replies, "profiling started"))

    @grpc_errors
    async def StopProfile(
        self, request: common_pb2.StopProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        req = sg.ProfileReq(req_type=sg.ProfileReqType.STOP_PROFILE)
        replies = await self.manager.control(req, sg.ProfileReqOutput, PROFILE_TIMEOUT_S)
        return common_pb2.ProfileResponse(**_joined(replies, "profiling stopped"))

    # -- KV events -------------------------------------------------------------------------

    @grpc_errors
    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: Context
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        sources = kv_events.kv_sources(self.config, self.manager.dp_size)
        async for batch in subscription(
            request, context, sources, _KV_OFF, load_source=self._load_record, metrics=self.metrics
        ):
            yield batch

    def _load_record(self, rank: int) -> common_pb2.EngineLoad | None:
        snapshot = loads.read_rank(self.load_reader, rank)
        return kv_events.engine_load(snapshot) if snapshot is not None else None

    # -- LoRA (:mod:`.lora`) -----------------------------------------------------------------

    @grpc_errors
    async def LoadLoRAAdapter(
        self, request: pb.LoadLoRAAdapterRequest, context: Context
    ) -> pb.LoadLoRAAdapterResponse:
        ids = await self.adapters.load(
            request.lora_name, request.lora_path, pinned=request.pinned, lora_id=request.lora_id
        )
        return pb.LoadLoRAAdapterResponse(success=True, message="", loaded_lora_ids=ids)

    @grpc_errors
    async def UnloadLoRAAdapter(
        self, request: pb.UnloadLoRAAdapterRequest, context: Context
    ) -> pb.UnloadLoRAAdapterResponse:
        ids = await self.adapters.unload(request.lora_name, request.lora_id)
        return pb.UnloadLoRAAdapterResponse(success=True, message="", loaded_lora_ids=ids)

    @grpc_errors
    async def ListLoadedLoRAAdapters(
        self, request: pb.ListLoadedLoRAAdaptersRequest, context: Context
    ) -> pb.ListLoadedLoRAAdaptersResponse:
        return pb.ListLoadedLoRAAdaptersResponse(
            loaded_adapters=[
                pb.LoadedLoRAAdapter(
                    lora_id=ref.lora_id,
                    lora_name=ref.lora_name or "",
                    lora_path=ref.lora_path or "",
                    pinned=bool(ref.pinned),
                )
                for _, ref in sorted(self.adapters.loaded().items())
            ]
        )


def _constrained(request: pb.GenerateRequest) -> bool:
    """Whether the request has a grammar (SGLang's metrics count those: ``num_so_requests``)."""
    return request.sampling_params.WhichOneof("constraint") is not None


def _joined(replies: list[Any], ok: str) -> dict[str, Any]:
    """success is the AND of the ranks' replies; failures' messages joined with " | "."""
    failed = [str(r.message or "failed") for r in replies if not r.success]
    return {"success": not failed and bool(replies), "message": " | ".join(failed) or ok}


def default_sampling(config: Any) -> dict[str, Any]:
    """The sampling defaults the model ships (``generation_config.json``), overlaid with
    ``--preferred-sampling-params``."""
    defaults: dict[str, Any] = {}
    path = Path(config.model_path) / "generation_config.json"
    with contextlib.suppress(OSError, ValueError):
        shipped = json.loads(path.read_text())
        defaults = {k: shipped[k] for k in _DEFAULT_SAMPLING_KEYS if k in shipped}
    preferred = config.preferred_sampling_params
    if preferred:
        with contextlib.suppress(ValueError, TypeError):
            extra = json.loads(preferred) if isinstance(preferred, str) else dict(preferred)
            defaults |= {k: v for k, v in extra.items() if k in _DEFAULT_SAMPLING_KEYS}
    return defaults


def model_facts(
    config: Any, facts: Mapping[str, Any], scheduler_info: Mapping[str, Any]
) -> ModelFacts:
    """What ``GetModelInfo`` reports: SGLang's resolved settings (``config``), the model's own
    config (``_sglang.model_facts``) and the scheduler's info (empty before it started)."""
    preferred = config.preferred_sampling_params
    if preferred and not isinstance(preferred, str):
        preferred = json.dumps(preferred)
    return ModelFacts(
        model_path=str(config.model_path),
        vocab_size=int(facts["vocab_size"]),
        # The model's context window (not the KV pool's capacity).
        max_context_length=int(facts["context_length"]),
        tokenizer_path=str(config.tokenizer_path or ""),
        is_generation=bool(facts["is_generation"]),
        preferred_sampling_params=preferred or "",
        weight_version=str(getattr(config, "weight_version", "") or "default"),
        served_model_name=str(config.served_model_name or config.model_path),
        # A vision model of a family whose image rules are known (images.FAMILIES), or a
        # language-only worker of a vision model (its encoders compute the pictures).
        supports_vision=(
            facts.get("image_rules") is not None or facts.get("encoder_image_token") is not None
        ),
        model_type=str(facts["model_type"]),
        eos_token_ids=tuple(facts["eos_token_ids"]),
        pad_token_id=int(facts["pad_token_id"]),
        bos_token_id=int(facts["bos_token_id"]),
        max_req_input_len=int(scheduler_info.get("max_req_input_len") or 0),
        architectures=tuple(facts["architectures"]),
        id2label=dict(facts["id2label"] or {}),
        num_labels=int(facts["num_labels"]),
        default_sampling_params=default_sampling(config),
    )

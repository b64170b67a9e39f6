"""``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` over TokenSpeed's in-process ``AsyncLLM``.

Generate runs each choice as one TokenSpeed request (``n > 1``: ``{rid}-n{i}``) and reads its
outputs through a bounded queue, so an ``Abort`` or a client cancel ends the call at once: the
choices still running end with ``complete{finish_reason: "abort"}`` (Abort) or the call is
cancelled (client), and every unfinished child is aborted in TokenSpeed, which sends the
scheduler an ``AbortReq``. Streaming sends one ``chunk`` per read of that queue that adds ids:
every step waiting for a choice goes out together (core ``stream``: one step while the reader
keeps up, the backlog when it is behind; ``token_ids`` is the delta, counts cumulative, as
TokenSpeed reports them), then a ``complete`` per choice with empty ``output_ids``;
non-streaming sends one ``complete`` per choice with every id and logprob.

A scheduler abort with an HTTP status maps through the HTTP table with the scheduler's message;
TokenSpeed's own request checks (``ValueError``) are INVALID_ARGUMENT with TokenSpeed's message;
core's shared checks run first, with the same messages as every engine.

An encode worker (``--disaggregation-mode encode``: TokenSpeed's EPD encode role, a vision tower
and no language model) serves ``TokenSpeedEncoder.Encode``: one image item and its bootstrap room
go to TokenSpeed's encode loop as its ``EncodeRequest``, acknowledged at once (the embedding goes
to the prefill worker, never back through here). The scheduler service stays for the router's
discovery (health, model and server info), but nothing that needs the language model or a
scheduler reply reaches the encode loop, which answers none: Generate is FAILED_PRECONDITION;
FlushCache, StartProfile and StopProfile are UNIMPLEMENTED; GetLoads is an empty report (a
GetLoads on an encode worker once killed the engine upstream, smg#2249); HealthCheck is shallow;
GetServerInfo does not ask the pause state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc.aio
from google.protobuf import struct_pb2, timestamp_pb2

from smg_servicer_core.config import setting_value
from smg_servicer_core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidRequest,
    Unavailable,
    Unsupported,
    grpc_errors,
)
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineLoad, LoadsSource, ServicerMetrics, rank_loads
from smg_servicer_core.proto import (
    common_pb2,
    tokenspeed_encoder_pb2,
    tokenspeed_encoder_pb2_grpc,
    tokenspeed_scheduler_pb2_grpc,
)
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.server import ServiceBinding, bind_servicer
from smg_servicer_core.servicer import EngineServicer
from smg_servicer_core.stream import coalescing, take_waiting
from smg_servicer_kv_bridge import subscription
from smg_servicer_tokenspeed import _tokenspeed as ts
from smg_servicer_tokenspeed import convert, info, kv_events, loads, mm
from smg_servicer_tokenspeed.convert import ChildSpec, Choice, Limits
from smg_servicer_tokenspeed.settings import HEALTH_TIMEOUT, PAIRING_PROTOCOL, PAUSE_PROBE_TIMEOUT

logger = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["TokenSpeedScheduler"].full_name
HEALTH_PROBE_PREFIX = "HEALTH_CHECK_"
HEALTH_POLL_S = 0.5
LOADS_TIMEOUT_S = 20.0
FLUSH_RETRY_S = 0.05
FLUSH_MIN_WINDOW_S = 2.0
FLUSH_MIN_BOUND_S = 30.0
PROFILE_TIMEOUT_S = 600.0
#: Outputs buffered per choice before the engine side waits (TokenSpeed merges what waits).
QUEUE_PER_CHOICE = 4
_ABORTED = object()
_MODALITY = {"image": common_pb2.IMAGE, "video": common_pb2.VIDEO, "audio": common_pb2.AUDIO}
#: What the encode role refuses: its loop has no language model and answers no control message.
_ENCODE_NO_GENERATE = (
    "Generate is unavailable on a TokenSpeed encode worker (--disaggregation-mode encode): it "
    "runs the vision tower only; the router sends it Encode"
)
_ENCODE_NO_CONTROL = (
    "{} is not served by a TokenSpeed encode worker (--disaggregation-mode encode): its encode "
    "loop answers no control message"
)


def _struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    result = struct_pb2.Struct()
    result.update(dict(value))
    return result


def _engine_error(exc: BaseException) -> BaseException:
    """TokenSpeed's request checks raise ValueError (its EngineGenerateError for a 400 abort): the
    client's fault, with TokenSpeed's own message. Anything else stays unexpected."""
    if isinstance(exc, ValueError):
        return InvalidRequest(str(exc) or "the engine refused the request")
    return exc


class Flight:
    """The choices of one ``Generate`` call running in TokenSpeed."""

    def __init__(self, llm: Any, specs: list[ChildSpec], feature_dtype: str = "") -> None:
        self.llm = llm
        self.specs = specs
        # Built before any task starts, so a request TokenSpeed's objects refuse fails the call.
        requests = [ts.generate_input(spec, feature_dtype=feature_dtype) for spec in specs]
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(QUEUE_PER_CHOICE * len(specs))
        self.pumps = [
            asyncio.create_task(self._pump(spec.index, req))
            for spec, req in zip(specs, requests, strict=True)
        ]

    async def _pump(self, index: int, req: Any) -> None:
        outputs = self.llm.generate_request(req)
        try:
            async for output in outputs:
                await self.queue.put((index, output))
        except Exception as exc:
            await self.queue.put((index, exc))
        finally:
            # An unfinished request is aborted in TokenSpeed (and its scheduler) by this close.
            await outputs.aclose()

    def abort(self) -> None:
        """Stop every choice now; the reader gets the abort marker next."""
        for spec in self.specs:
            self.llm.abort_request(spec.rid)
        for pump in self.pumps:
            pump.cancel()
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait((-1, _ABORTED))

    async def close(self) -> None:
        for pump in self.pumps:
            pump.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)


class TokenSpeedServicer(EngineServicer, tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerServicer):
    wire = pb
    wire_grpc = tokenspeed_scheduler_pb2_grpc
    service = "TokenSpeedScheduler"

    def __init__(
        self,
        launched: ts.Launched,
        *,
        health: HealthFrame | None = None,
        metrics: ServicerMetrics | None = None,
        health_timeout_s: float | None = None,
        coalesce: bool | None = None,
    ) -> None:
        self.launched = launched
        #: Every step waiting for a stream goes out as one message (core ``stream``).
        self.coalesce = coalescing() if coalesce is None else coalesce
        self.llm: Any = launched.llm
        self.server_args: Any = launched.server_args
        self.scheduler_info = launched.scheduler_info
        self.facts = ts.model_facts(self.llm)
        self.limits = Limits(
            vocab_size=int(self.facts["vocab_size"]),
            context_length=int(self.facts["context_length"]),
            decode_role=ts.disaggregation_mode(self.server_args) == "decode",
        )
        self.dp_size = ts.dp_size(self.server_args)
        self.feature_dtype = str(self.scheduler_info.get("multimodal_encoder_dtype") or "")
        #: TokenSpeed's EPD encode role (no language model; the encoder service is served).
        self.encode_role = ts.disaggregation_mode(self.server_args) == "encode"
        self.health_timeout_s = (
            health_timeout_s if health_timeout_s is not None else setting_value(HEALTH_TIMEOUT)
        )
        #: The launcher's verdict: a reason once a scheduler rank or a front-end loop died.
        self.dead_reason: Callable[[], str | None] = lambda: None
        self._flights: dict[str, Flight] = {}
        self._pause_probe: asyncio.Task[Any] | None = None
        super().__init__(health=health, metrics=metrics)

    def bindings(self) -> list[ServiceBinding]:
        """The scheduler service and the encoder service (UNIMPLEMENTED but on an encode
        worker)."""
        add = getattr(tokenspeed_encoder_pb2_grpc, "add_TokenSpeedEncoderServicer_to_server")  # noqa: B009 - the generated module has no stubs
        name = tokenspeed_encoder_pb2.DESCRIPTOR.services_by_name["TokenSpeedEncoder"].full_name
        encoder = bind_servicer(name, add, EncoderServicer(self))
        return [self.binding(), encoder]

    @property
    def capacity(self) -> int:
        return int(self.scheduler_info.get("max_total_num_tokens") or 0)

    def engine_loads(self) -> LoadsSource | None:
        def read() -> list[EngineLoad]:
            return rank_loads(self._load_rows(None))

        return read

    # -- Generate --------------------------------------------------------------------------

    @grpc_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        if self.encode_role:
            raise FailedPrecondition(_ENCODE_NO_GENERATE)
        specs = convert.generate_specs(request, self.limits)
        rid = request.request_id
        async with self.registry.track(rid):
            flight = Flight(self.llm, specs, self.feature_dtype)
            self._flights[rid] = flight
            try:
                async for message in self._stream(request, flight):
                    yield message
            finally:
                self._flights.pop(rid, None)
                await flight.close()

    async def _stream(
        self, request: pb.GenerateRequest, flight: Flight
    ) -> AsyncIterator[pb.GenerateResponse]:
        rid = request.request_id
        want_top = request.top_logprobs_num > 0
        choices = [
            Choice(s.index, request.stream, s.no_stop_trim, request.return_logprob, want_top)
            for s in flight.specs
        ]
        running = set(range(len(choices)))
        while running:
            # Every output waiting goes out together: one message per choice (core ``stream``).
            waiting: dict[int, list[convert.Frame]] = {}
            for index, item in await take_waiting(flight.queue, self.coalesce):
                if item is _ABORTED:
                    for i in sorted(running):
                        yield pb.GenerateResponse(request_id=rid, complete=choices[i].aborted())
                    return
                if isinstance(item, BaseException):
                    raise _engine_error(item) from item
                frame = convert.frame(item)
                if (error := convert.failure(frame.finish, rid)) is not None:
                    logger.warning("request %s: the scheduler aborted it (%s)", rid, frame.finish)
                    raise error
                waiting.setdefault(index, []).append(frame)
            for index, frames in waiting.items():
                frame = convert.merged(frames)
                choice = choices[index]
                if request.stream and (chunk := choice.chunk(frame)) is not None:
                    yield pb.GenerateResponse(request_id=rid, chunk=chunk)
                if frame.finish is not None:
                    running.discard(index)
                    yield pb.GenerateResponse(request_id=rid, complete=choice.complete(frame))

    # -- abort, health ---------------------------------------------------------------------

    def _engine_children(self, request_id: str) -> list[str]:
        child = re.compile(rf"^{re.escape(request_id)}-n\d+$")
        return [r for r in list(self.llm.rid_to_state) if r == request_id or child.match(r)]

    async def engine_abort(self, request_id: str) -> None:
        flight = self._flights.get(request_id)
        if flight is not None:
            flight.abort()  # aborts its own children in TokenSpeed
            return
        for rid in self._engine_children(request_id):
            self.llm.abort_request(rid)

    @grpc_errors
    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortResponse:
        reason = request.reason or "aborted by request"
        if await self.registry.abort(request.request_id, reason):
            return pb.AbortResponse(success=True, message="aborted")
        found = self._engine_children(request.request_id)
        for rid in found:
            self.llm.abort_request(rid)
        return pb.AbortResponse(success=bool(found), message="aborted" if found else "not found")

    async def probe(self) -> str | None:
        return self.dead_reason()

    @grpc_errors
    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Context
    ) -> pb.HealthCheckResponse:
        """Deep: a one-token request must reach the scheduler and come back (or any scheduler
        output arrive meanwhile) within the probe timeout. Shallow on a disaggregation role."""
        if (reason := await self.health.reason()) is not None:
            return pb.HealthCheckResponse(healthy=False, message=reason)
        if getattr(self.llm, "gracefully_exit", False):
            return pb.HealthCheckResponse(healthy=False, message="shutting down")
        if ts.disaggregation_mode(self.server_args) != "null":
            return pb.HealthCheckResponse(healthy=True, message="OK")
        healthy, message = await self._deep_probe()
        return pb.HealthCheckResponse(healthy=healthy, message=message)

    async def _deep_probe(self) -> tuple[bool, str]:
        rid = f"{HEALTH_PROBE_PREFIX}{uuid.uuid4().hex}"
        spec = ChildSpec(rid, 0, [0], {"max_new_tokens": 1, "temperature": 0.0}, stream=True)
        started = time.time()
        outputs = self.llm.generate_request(ts.generate_input(spec, log_metrics=False))
        first = asyncio.ensure_future(outputs.__anext__())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.health_timeout_s
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False, f"the scheduler did not answer within {self.health_timeout_s:g}s"
                await asyncio.wait({first}, timeout=min(HEALTH_POLL_S, remaining))
                if first.done():
                    if first.cancelled() or first.exception() is not None:
                        return False, "health probe failed"
                    return True, "OK"
                if self.llm.last_receive_tstamp > started:
                    return True, "OK"
        finally:
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            await outputs.aclose()
            self.llm.abort_request(rid)
            self.llm.drop_request_state(rid)

    # -- info ------------------------------------------------------------------------------

    def tokenizer_dir(self) -> str | Path | None:
        return self.server_args.tokenizer or self.server_args.model or None

    def model_facts(self) -> ModelFacts:
        args, facts = self.server_args, self.facts
        return ModelFacts(
            model_path=str(args.model),
            vocab_size=self.limits.vocab_size,
            max_context_length=self.limits.context_length,
            served_model_name=str(args.served_model_name or args.model),
            tokenizer_path=str(args.tokenizer or ""),
            is_generation=bool(facts["is_generation"]),
            supports_vision=bool(facts["modalities"]),
            model_type=str(facts["model_type"]),
            architectures=tuple(facts["architectures"]),
            eos_token_ids=tuple(facts["eos_token_ids"]),
            pad_token_id=int(facts["pad_token_id"]),
            bos_token_id=int(facts["bos_token_id"]),
            max_req_input_len=int(facts["max_req_input_len"]),
            preferred_sampling_params=str(args.preferred_sampling_params or ""),
            weight_version=str(args.weight_version or "default"),
        )

    @grpc_errors
    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Context
    ) -> pb.GetModelInfoResponse:
        reply = self.model_facts().to_proto(pb.GetModelInfoResponse)
        # The wire's default_sampling_params_json is TokenSpeed's --preferred-sampling-params.
        reply.default_sampling_params_json = str(self.server_args.preferred_sampling_params or "")
        modalities = [_MODALITY[m] for m in self.facts["modalities"]]
        reply.supported_modalities.extend(modalities)  # pyright: ignore[reportUnknownMemberType]
        reply.supports_multimodal = bool(modalities)
        dtype = str(self.scheduler_info.get("multimodal_encoder_dtype") or "")
        reply.multimodal_encoder_dtype = dtype
        reply.model_dtype = dtype if dtype in ("bfloat16", "float16", "float32") else ""
        return reply

    def _labels(self) -> dict[str, Any]:
        args = self.server_args
        labels: dict[str, Any] = {
            "pairing_protocol": setting_value(PAIRING_PROTOCOL),
            "engine_reasoning_parser": str(args.reasoning_parser or ""),
            "constrained_decoding_start": "first_token",
        }
        backend = str(getattr(args, "grammar_backend", "") or "")
        if backend and backend != "none":
            labels["grammar_backend"] = backend
        if self.dp_size > 1:
            labels["dp_size"] = self.dp_size
        with contextlib.suppress(Exception):
            labels.update(self.llm.rl_advertisement() or {})
        return labels

    async def _is_paused(self) -> bool:
        """The scheduler's own pause state (TokenSpeed's ``pause_scheduler`` until
        ``resume_scheduler``, as its RL control app's ``/pause_generation`` and
        ``/continue_generation`` drive them), waited for at most the probe timeout; a probe
        still pending is reused by the next call instead of piling up another. A scheduler that
        does not answer in time, or a probe that fails, is UNAVAILABLE: not reported as serving.
        An encode loop has no pause state and answers no probe: not paused."""
        if self.encode_role:
            return False
        probe = self._pause_probe
        if probe is None or probe.done():
            probe = self._pause_probe = asyncio.ensure_future(self.llm.is_scheduler_paused())
        wait_s = setting_value(PAUSE_PROBE_TIMEOUT)
        await asyncio.wait({probe}, timeout=wait_s)
        if not probe.done():
            raise Unavailable(f"the scheduler did not say within {wait_s:g} s whether it is paused")
        if probe.cancelled() or probe.exception() is not None:
            raise Unavailable("the scheduler could not say whether it is paused")
        return bool(probe.result())

    @grpc_errors
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        start = timestamp_pb2.Timestamp()
        start.FromSeconds(int(self.started_wall))
        return pb.GetServerInfoResponse(
            server_args=_struct(info.server_args(self.server_args, self._labels())),
            scheduler_info=_struct(info.server_args(self.scheduler_info, {})),
            active_requests=len(self.registry),
            is_paused=await self._is_paused(),
            uptime_seconds=self.uptime_s(),
            max_total_num_tokens=self.capacity,
            tokenspeed_version=ts.TOKENSPEED_VERSION,
            start_time=start,
        )

    def _load_rows(self, rank: int | None) -> list[pb.SchedulerLoad]:
        snapshots = self.llm.load_snapshot_store.fresh_snapshots()
        max_seqs = int(self.scheduler_info.get("max_num_seqs") or 0)
        return loads.rows(snapshots, self.dp_size, self.capacity, max_seqs, rank)

    @grpc_errors
    async def GetLoads(self, request: pb.GetLoadsRequest, context: Context) -> pb.GetLoadsResponse:
        rank = request.dp_rank if request.HasField("dp_rank") else None
        if rank is not None and not 0 <= rank < self.dp_size:
            raise InvalidRequest(f"dp_rank {rank} does not exist (ranks: {self.dp_size})")
        if self.encode_role:  # no KV cache, no load snapshot; the encode loop answers no query
            return pb.GetLoadsResponse(
                timestamp=datetime.now(UTC).isoformat(),
                version=ts.TOKENSPEED_VERSION,
                aggregate=loads.aggregate([]),
            )
        try:
            await asyncio.wait_for(self.llm.get_load(), LOADS_TIMEOUT_S)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"the engine's loads took over {LOADS_TIMEOUT_S:g}s") from exc
        rows = self._load_rows(rank)
        return pb.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(),
            version=ts.TOKENSPEED_VERSION,
            dp_rank_count=len(rows),
            loads=rows,
            aggregate=loads.aggregate(rows),
        )

    # -- control ---------------------------------------------------------------------------

    @grpc_errors
    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: Context
    ) -> common_pb2.FlushCacheResponse:
        if self.encode_role:
            raise Unsupported(_ENCODE_NO_CONTROL.format("FlushCache"))
        timeout_s = float(request.timeout_s)
        if not math.isfinite(timeout_s) or timeout_s < 0:
            raise InvalidRequest(f"timeout_s must be a finite number >= 0, got {timeout_s}")
        bound = max(FLUSH_MIN_BOUND_S, timeout_s + 10.0)
        try:
            return await asyncio.wait_for(self._flush(max(timeout_s, FLUSH_MIN_WINDOW_S)), bound)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"the cache flush took over {bound:g}s") from exc

    async def _flush(self, window_s: float) -> common_pb2.FlushCacheResponse:
        """Flush succeeds only with nothing in flight: retry until it does, for ``window_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window_s
        attempts = 0
        while True:
            attempts += 1
            result = await self.llm.flush_cache()
            if result.success:
                return common_pb2.FlushCacheResponse(success=True, message="cache flushed")
            if loop.time() >= deadline:
                return common_pb2.FlushCacheResponse(
                    success=False,
                    message=(
                        f"Cache flush refused: requests still in flight after {attempts} attempts"
                    ),
                )
            await asyncio.sleep(FLUSH_RETRY_S)

    async def _profile(self, call: Any, ok: str) -> common_pb2.ProfileResponse:
        try:
            await asyncio.wait_for(call, PROFILE_TIMEOUT_S)
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"profiling did not answer within {PROFILE_TIMEOUT_S:g}s"
            ) from exc
        except RuntimeError as exc:  # the scheduler's ProfileReqOutput.message
            return common_pb2.ProfileResponse(success=False, message=str(exc))
        return common_pb2.ProfileResponse(success=True, message=ok)

    @grpc_errors
    async def StartProfile(
        self, request: common_pb2.StartProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        if self.encode_role:
            raise Unsupported(_ENCODE_NO_CONTROL.format("StartProfile"))

        def opt(name: str) -> Any:
            return getattr(request, name) if request.HasField(name) else None

        call = self.llm.start_profile(
            output_dir=opt("output_dir"),
            start_step=opt("start_step"),
            num_steps=opt("num_steps"),
            activities=list(request.activities) or None,
            with_stack=opt("with_stack"),
            record_shapes=opt("record_shapes"),
            profile_by_stage=request.profile_by_stage,
        )
        return await self._profile(call, "profiling started")

    @grpc_errors
    async def StopProfile(
        self, request: common_pb2.StopProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        if self.encode_role:
            raise Unsupported(_ENCODE_NO_CONTROL.format("StopProfile"))
        return await self._profile(self.llm.stop_profile(), "profiling stopped")

    # -- KV events -------------------------------------------------------------------------

    @grpc_errors
    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: Context
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        sources = kv_events.kv_sources(self.server_args.kv_events_config, self.dp_size)
        load = self._load_record
        async for batch in subscription(
            request, context, sources, kv_events.OFF, load_source=load, metrics=self.metrics
        ):
            yield batch

    def _load_record(self, rank: int) -> common_pb2.EngineLoad | None:
        for snapshot in self.llm.load_snapshot_store.fresh_snapshots():
            if snapshot.dp_rank == rank:
                return kv_events.engine_load(snapshot, self.capacity)
        return None


class EncoderServicer(tokenspeed_encoder_pb2_grpc.TokenSpeedEncoderServicer):
    """``TokenSpeedEncoder``: served by an encode worker only."""

    def __init__(self, servicer: TokenSpeedServicer) -> None:
        self.servicer = servicer
        #: Where prefill workers fetch this worker's embeddings: its own bootstrap server.
        self.bootstrap: tuple[str, int] | None = None

    @grpc_errors
    async def Encode(
        self, request: tokenspeed_encoder_pb2.EncodeRequest, context: Context
    ) -> tokenspeed_encoder_pb2.EncodeResponse:
        owner = self.servicer
        if not owner.encode_role:
            raise Unsupported(
                "this worker does not run TokenSpeed's encode role (start it with "
                "--disaggregation-mode encode); send multimodal items with Generate"
            )
        item, room = mm.encode_item(request)
        if self.bootstrap is None:
            self.bootstrap = ts.encode_bootstrap(owner.server_args)
        host, port = self.bootstrap
        rid = request.request_id or uuid.uuid4().hex
        encode = ts.encode_request(rid, (host, port, room), item, owner.feature_dtype)
        owner.llm.submit_encode(encode)
        logger.info("encode request %s (room %d) handed to the encode loop", rid, room)
        return tokenspeed_encoder_pb2.EncodeResponse(accepted=True)

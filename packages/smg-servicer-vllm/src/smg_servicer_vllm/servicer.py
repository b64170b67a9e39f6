"""``VllmEngineServicer(async_llm, start_time, mm_settings=None)``: ``vllm.grpc.engine.VllmEngine``
over an in-process ``AsyncLLM`` (vLLM's own launcher constructs it and owns the server).

Generate streams vLLM's DELTA outputs: per choice index, one chunk per engine output (delta
``token_ids`` and delta ``completion_tokens``; vLLM merges the steps a stream is behind on into
one output, so a stream that is behind gets them as one chunk: core ``stream``), then a
``complete`` for that index when it finishes (its last delta, the cumulative count, the finish
reason and the matched stop). Without streaming, one ``complete`` per choice with every id.
``Abort`` and a client cancel stop the engine request exactly once (core's registry); an aborted
stream ends with the ``complete`` vLLM reports (``finish_reason="abort"``), or with status ABORTED
when the engine reported nothing.

Health is the engine's one :class:`~smg_servicer_core.health.HealthFrame`, shared with the
``VllmHealthServicer`` the launcher registers (``health_servicer.health_for``).
Metrics: ``SMG_VLLM_SERVICER_METRICS_PORT`` / ``_HOST`` (vLLM's launcher owns the command line)
start ``/metrics`` when the servicer is built; a launcher may pass ``metrics=`` instead.

Constructing it freezes the process's start-up heap (``smg_servicer_core.gcheap``): vLLM's launcher
builds it after AsyncLLM has started, and without the freeze every full garbage collection walks
vLLM's ~610,000 start-up objects (a 340 ms stall of every stream here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import Any

import grpc.aio

from smg_servicer_core import tracing, validate
from smg_servicer_core.cli import metrics_settings, start_metrics
from smg_servicer_core.config import environment, resolve
from smg_servicer_core.errors import (
    Aborted,
    ConfigError,
    DeadlineExceeded,
    InvalidRequest,
    ServicerError,
    grpc_errors,
)
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.gcheap import freeze_startup_heap
from smg_servicer_core.loads import LoadTracker
from smg_servicer_core.metrics import (
    EngineLoad,
    EngineMetrics,
    LoadsSource,
    MetricsServer,
    ServicerMetrics,
)
from smg_servicer_core.proto import common_pb2, vllm_engine_pb2_grpc
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.registry import RequestHandle
from smg_servicer_core.servicer import EngineServicer
from smg_servicer_core.stream import coalescing
from smg_servicer_kv_bridge import subscription
from smg_servicer_vllm import (
    _engine,
    convert,
    info,
    kv_events,
    kv_transfer,
    logs,
    media_identity,
    releases,
)
from smg_servicer_vllm.errors import Translated, translated
from smg_servicer_vllm.health_servicer import health_for
from smg_servicer_vllm.mm import has_tensors
from smg_servicer_vllm.mm_settings import MmSettings, resolve_mm_settings
from smg_servicer_vllm.multimodal import MediaPlan, MultimodalPath
from smg_servicer_vllm.plugin import in_launcher_process, launcher_settings, servicer_impl_line
from smg_servicer_vllm.sampling import SamplingSpec, kv_transfer_params, to_sampling_spec

logger = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
_KV_OFF = (
    "KV events are off: start vLLM with --kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\' to enable them; '
    "the router falls back to GetLoads"
)
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
#: How long a KV-transfer rejection notice may take to reach the engine.
NOTICE_TIMEOUT_S = 10.0
FLUSH_ATTEMPT_S = 30.0
#: How often the launcher's death watch reads ``AsyncLLM.errored`` (a bool: nothing to pay).
DEATH_POLL_S = 0.1
PROFILE_TIMEOUT_S = 600.0
_METRICS = metrics_settings("vllm")


async def _unless_stopped(work: Coroutine[Any, Any, Any], handle: RequestHandle) -> Any:
    """``work``'s result, or ABORTED as soon as the request is stopped (``work`` cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(handle.stopped.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise Aborted(f"request {handle.request_id} was aborted")
    return task.result()


def trace_headers(context: Context) -> dict[str, str] | None:
    """The caller's W3C trace context, for vLLM's own tracing (``--otlp-traces-endpoint``)."""
    return tracing.trace_headers(context.invocation_metadata())


def _identity(request_id: str, engine_input: Any) -> pb.MediaIdentity | None:
    """The prefill side's ``media_identity`` (:mod:`.media_identity`); None, with a warning, when
    the engine input does not read as expected (the decode side then processes the media)."""
    try:
        return media_identity.identity_of(engine_input)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        logger.warning(
            "request %s: no media identity for the decode side (%s)", request_id, type(exc).__name__
        )
        return None


def _chunk(delta: list[int], common: dict[str, Any]) -> pb.GenerateResponse:
    """A stream chunk of ``delta``, built in place (a nested message passed to a constructor is
    copied: twice the cost, once per streamed message)."""
    response = pb.GenerateResponse()
    chunk = response.chunk
    chunk.token_ids.extend(delta)
    chunk.completion_tokens = len(delta)
    chunk.prompt_tokens = common["prompt_tokens"]
    chunk.cached_tokens = common["cached_tokens"]
    chunk.index = common["index"]
    if (out_lp := common["output_logprobs"]) is not None:
        chunk.output_logprobs.CopyFrom(out_lp)
    if (in_lp := common["input_logprobs"]) is not None:
        chunk.input_logprobs.CopyFrom(in_lp)
    return response


@dataclass
class _Choice:
    count: int = 0
    sent_input_logprobs: bool = False
    done: bool = False


@dataclass
class _Progress:
    """How far a Generate got: whether vLLM was handed the request (its ``generate()``
    started) and the stage of the engine's errors (``building_request`` until vLLM accepts it)."""

    entered: bool = False
    stage: Translated | None = None

    def taken(self, exc: BaseException) -> bool:
        """Whether the engine took the request that ``exc`` ends: a cancel while vLLM holds it
        aborts it there, which the KV connector hears; otherwise once vLLM accepted it."""
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):
            return self.entered
        return self.stage is not None and not self.stage.building_request


class VllmEngineServicer(EngineServicer, vllm_engine_pb2_grpc.VllmEngineServicer):
    wire = pb
    wire_grpc = vllm_engine_pb2_grpc
    service = "VllmEngine"

    def __init__(
        self,
        async_llm: Any,
        start_time: float,
        mm_settings: MmSettings | None = None,
        *,
        metrics: ServicerMetrics | None = None,
    ) -> None:
        self.engine = async_llm
        self.start_time = start_time
        launch = launcher_settings()
        try:
            if mm_settings is None:
                mm_settings = launch.mm if launch else resolve_mm_settings(None, environment())
            metrics_config = launch.metrics if launch else resolve(_METRICS, None, environment())
            self.multimodal = MultimodalPath(async_llm, mm_settings)
            #: vLLM's collector merges the steps a stream is behind on (DELTA outputs); they go
            #: out as one chunk, or one per token with ``SMG_STREAM_COALESCE=0`` (core ``stream``).
            self.coalesce = coalescing()
        except ConfigError as exc:
            logger.error("%s", exc)
            raise SystemExit(2) from None
        self.mm_settings = mm_settings
        self.loads = LoadTracker()
        #: Wall time of the last engine output (0: none yet): ``last_receive_timestamp``.
        self.last_receive = 0.0
        #: Rejection notices on their way to the engine (kept until sent: see Generate).
        self._notices: set[asyncio.Task[None]] = set()
        self.metrics_server: MetricsServer | None = None
        engine_metrics = EngineMetrics(_engine.prometheus_registry(), "vLLM")
        tls = launch.tls if launch else None  # the gRPC port's, which /metrics then has too
        if metrics is None and (started := start_metrics(metrics_config, engine_metrics, tls)):
            metrics, self.metrics_server = started
        super().__init__(health=health_for(async_llm), metrics=metrics)
        logs.route_through_vllm()
        freeze_startup_heap()
        if in_launcher_process():
            logger.info(servicer_impl_line())
        logger.info("multimodal settings: %s", mm_settings.describe())
        logger.info(
            "VllmEngineServicer initialized (mm_processor=%s, source=%s)",
            self.multimodal.mode,
            mm_settings.source,
        )
        self._death_watch: asyncio.Task[None] | None = None
        if in_launcher_process():  # never a process that only ran the parser (a test run)
            with contextlib.suppress(RuntimeError):  # no running loop: nobody to stop
                self._death_watch = asyncio.get_running_loop().create_task(self._watch_engine())

    async def _watch_engine(self) -> None:
        """In vLLM's gRPC launcher: once the engine core is dead (``AsyncLLM.errored``, set by
        vLLM's own process monitor), stop the process the way a SIGTERM does. The launcher waits
        for a signal only, so without this a worker whose engine died kept its port open for
        good, answering UNAVAILABLE (found by the reliability suite)."""
        # vLLM's monitor thread sets a plain flag: there is no event to wait on.
        while not getattr(self.engine, "errored", False):  # noqa: ASYNC110
            await asyncio.sleep(DEATH_POLL_S)
        logger.error("engine died: vLLM's engine core is not running; stopping the server")
        signal.raise_signal(signal.SIGTERM)

    async def engine_abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def engine_loads(self) -> LoadsSource | None:
        def read() -> list[EngineLoad]:
            snapshot = self.loads.snapshot()
            response = info.loads(self.engine, snapshot, None, _engine.VLLM_VERSION)
            return info.engine_load(self.engine, response)

        return read

    def model_facts(self) -> ModelFacts:
        # Images are served (preprocessed tensors at least) exactly when the model takes them.
        vision = self.multimodal.facts.supported and "image" in self.multimodal.limits
        return replace(info.model_facts(self.engine), supports_vision=vision)

    def tokenizer_dir(self) -> str | None:
        return str(getattr(self.engine.model_config, "tokenizer", "") or "") or None

    # Generate ----------------------------------------------------------------------------------

    def _prompt(self, request: pb.GenerateRequest, kv: dict[str, Any] | None) -> Any:
        """The request's prompt, checked before anything else (client faults only): vLLM's text
        or tokens prompt, or for a multimodal request its :class:`MediaPlan` (media fetched and
        tensors read once the request is tracked). A decode-side request of a prefill/decode
        split may carry its media's identity without pixels (:mod:`.media_identity`). A refused
        request's unread shared-memory tensors are freed."""
        try:
            kind = request.WhichOneof("input")
            media = request.HasField("media_refs") or has_tensors(request)
            if kind == "tokenized":
                ids = list(request.tokenized.input_ids)
                mc = self.engine.model_config
                validate.prompt(ids, int(mc.get_vocab_size()), int(mc.max_model_len))
                text = request.tokenized.original_text
                if media_identity.pixel_less(request) and not request.HasField("media_refs"):
                    return self._decode_side_prompt(request, ids, text, kv)
                if media:
                    return self.multimodal.plan(request, ids)
                return _engine.tokens_prompt(ids, text)
            if media:
                raise InvalidRequest(
                    "multimodal input needs tokenized input (with its placeholders)"
                )
            if kind == "text" and request.text:
                return request.text
            raise InvalidRequest("the request has no input (tokenized or text)")
        except InvalidRequest:
            self.multimodal.release(request)
            raise

    def _decode_side_prompt(
        self, request: pb.GenerateRequest, ids: list[int], text: str, kv: dict[str, Any] | None
    ) -> Any:
        if not self.multimodal.facts.supported:
            raise InvalidRequest("this model accepts no multimodal input")
        if not media_identity.remote_prefill(kv):
            raise InvalidRequest(
                "mm_inputs: pixel_values is missing (a request without pixels is served only on "
                "the decode side of a prefill/decode split: kv_transfer_params with "
                "do_remote_prefill)"
            )
        salt = media_identity.decode_salt(request, ids)
        self.multimodal.release(request)  # the grid tensors' shared memory: nothing reads it
        return _engine.tokens_prompt(ids, text, cache_salt=salt)

    def _checked(
        self, request: pb.GenerateRequest, kv: dict[str, Any] | None
    ) -> tuple[Any, SamplingSpec, Any]:
        """Every check of a request, before anything else: its prompt (:meth:`_prompt`), its
        sampling spec and vLLM's sampling parameters. A refused request's unread shared-memory
        tensors are freed."""
        prompt = self._prompt(request, kv)
        try:
            spec = to_sampling_spec(request.sampling_params)
            with translated(building_request=True):
                params = _engine.sampling_params(spec, stream=request.stream, kv_transfer=kv)
        except InvalidRequest:
            self.multimodal.release(request)  # refused: nobody reads its tensors now
            raise
        return prompt, spec, params

    async def _engine_input(
        self, request: pb.GenerateRequest, prompt: Any, kv: dict[str, Any] | None, handle: Any
    ) -> tuple[Any, pb.MediaIdentity | None]:
        """vLLM's input of a checked prompt, while the request is tracked (``handle``: an Abort
        or a cancel stops the work): a :class:`MediaPlan`'s media fetched and processed or its
        tensors read, with the media's identity for the decode side when a prefill/decode
        split's prefill side asks for it (``do_remote_decode``)."""
        if not isinstance(prompt, MediaPlan):
            return prompt, None
        engine_input = await _unless_stopped(self.multimodal.engine_input(prompt), handle)
        identity = None
        if prompt.items and kv is not None and kv.get("do_remote_decode"):
            identity = _identity(request.request_id, engine_input)
        return engine_input, identity

    def _owes_notice(self, kv: dict[str, Any] | None) -> bool:
        """Whether the KV connector must hear of a request that asks for a remote prefill and
        fails before the engine took it (:mod:`.kv_transfer`)."""
        config = getattr(self.engine.vllm_config, "kv_transfer_config", None)
        return kv is not None and kv_transfer.owes_rejection_notice(config, kv)

    @grpc_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        """A request that asks for a remote prefill and fails before the engine took it (refused
        here or by vLLM on arrival, aborted or cancelled while its media are fetched) is reported
        to the KV connector, which would otherwise keep the prefill worker's blocks pinned
        (:mod:`.kv_transfer`)."""
        kv = kv_transfer_params(request)  # an invalid one is refused with nothing to report
        owed = self._owes_notice(kv)
        rank = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
        progress = _Progress()
        try:
            prompt, spec, params = self._checked(request, kv)
            choices: dict[int, _Choice] = {}
            # Media are fetched and tensors built while the request is tracked, so that an Abort
            # or a cancel during that work stops it.
            async with self.registry.track(request.request_id) as handle:
                prompt, identity = await self._engine_input(request, prompt, kv, handle)
                # aclosing: a cancelled RPC closes generate() at once, wherever it was suspended,
                # so vLLM aborts the request (vLLM 0.34's drain waits for exactly that).
                with translated() as progress.stage:
                    stream = self._engine_stream(
                        request, context, prompt, params, spec=spec, rank=rank
                    )
                    async with contextlib.aclosing(stream):
                        progress.entered = True
                        async for output in stream:
                            progress.stage.building_request = False  # vLLM accepted the request
                            for response in self._responses(
                                output, request.stream, spec, choices, identity
                            ):
                                yield response
                if handle.aborted and not all(c.done for c in choices.values()):
                    raise Aborted(f"request {request.request_id} was aborted")
        except BaseException as exc:
            if owed and kv is not None and not progress.taken(exc):
                self._notify_rejected(request.request_id, kv, rank)
            raise

    def _engine_stream(
        self,
        request: pb.GenerateRequest,
        context: Context,
        prompt: Any,
        params: Any,
        *,
        spec: SamplingSpec,
        rank: int | None,
    ) -> Any:
        """vLLM's ``generate()`` of the request (an async generator, not yet started). A raw
        prompt (a token prompt: a dict vLLM has not rendered) is rendered here first
        (:func:`._engine.rendered_tokens`; its errors are the request's, raised before vLLM took
        it). A constraint the router shaped to start at the first token
        (``grammar_from_first_token``) starts there whatever reasoning parser the engine runs:
        vLLM's ``reasoning_ended``."""
        tokenization = spec.tokenization
        if isinstance(prompt, dict) and "type" not in prompt:
            prompt, tokenization = _engine.rendered_tokens(self.engine, prompt, tokenization)
        sampling = request.sampling_params
        shaped = sampling.grammar_from_first_token and sampling.WhichOneof("constraint")
        return self.engine.generate(
            prompt,
            params,
            request.request_id,
            tokenization_kwargs=tokenization,
            trace_headers=trace_headers(context),
            data_parallel_rank=rank,
            **({"reasoning_ended": True} if shaped else {}),
        )

    def _notify_rejected(self, rid: str, kv: dict[str, Any], rank: int | None) -> None:
        notify = releases.rejection_notice(self.engine)
        if notify is None:  # vLLM before 0.21 takes no notice
            return
        task = asyncio.ensure_future(self._send_notice(notify, rid, kv, rank))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    @staticmethod
    async def _send_notice(
        notify: Callable[..., Any], rid: str, kv: dict[str, Any], rank: int | None
    ) -> None:
        try:
            call = notify(rid, dict(kv), **releases.keywords(notify, data_parallel_rank=rank))
            await asyncio.wait_for(call, NOTICE_TIMEOUT_S)
            logger.info("request %s was refused before the engine: the KV connector is told", rid)
        except Exception as exc:  # the engine is gone or busy: nothing else to do for it
            logger.warning(
                "request %s: the KV connector could not be told it was refused (%s)",
                rid, type(exc).__name__,
            )  # fmt: skip

    def _responses(
        self,
        output: Any,
        stream: bool,
        spec: SamplingSpec,
        choices: dict[int, _Choice],
        identity: pb.MediaIdentity | None = None,
    ) -> Iterator[pb.GenerateResponse]:
        self.last_receive = time.time()  # GetServerInfo's last_receive_timestamp
        prompt_ids = output.prompt_token_ids or ()  # not copied: read per token on hot paths
        prompt_len = len(prompt_ids)
        cached = int(output.num_cached_tokens or 0)
        if not choices:
            self.loads.record_prompt(prompt_len, cached)
        top_n = spec.kwargs["logprobs"] or 0
        top_n_prompt = spec.kwargs["prompt_logprobs"] or 0
        for completion in output.outputs:
            choice = choices.setdefault(completion.index, _Choice())
            if choice.done:
                continue
            delta = list(completion.token_ids)
            positions = completion.logprobs if spec.kwargs["logprobs"] is not None else None
            self.loads.record_tokens(len(delta))
            choice.count += len(delta)
            in_lp = None
            if not choice.sent_input_logprobs and spec.kwargs["prompt_logprobs"] is not None:
                in_lp = convert.input_logprobs(
                    list(prompt_ids), output.prompt_logprobs, top_n_prompt
                )
                choice.sent_input_logprobs = True
            common: dict[str, Any] = {
                "prompt_tokens": prompt_len,
                "cached_tokens": cached,
                "index": completion.index,
                "input_logprobs": in_lp,
            }
            if stream and not self.coalesce and len(delta) > 1:
                # vLLM merged steps while this stream was behind; send them one by one.
                for i in range(len(delta) - 1):
                    step = delta[i : i + 1]
                    lp = None if positions is None else positions[i : i + 1]
                    common["output_logprobs"] = convert.output_logprobs(step, lp, top_n)
                    yield _chunk(step, common)
                    common["input_logprobs"] = None
                delta = delta[-1:]
                positions = None if positions is None else positions[-1:]
            common["output_logprobs"] = convert.output_logprobs(delta, positions, top_n)
            if stream and (delta or in_lp is not None):
                yield _chunk(delta, common)
                common["output_logprobs"] = common["input_logprobs"] = None
            if completion.finish_reason is None:
                continue
            choice.done = True
            yield pb.GenerateResponse(
                complete=pb.GenerateComplete(
                    output_ids=delta,
                    completion_tokens=choice.count,
                    **common,
                    **convert.finish_fields(completion),
                    **convert.spec_fields(completion),
                    **convert.kv_params_fields(getattr(output, "kv_transfer_params", None)),
                    media_identity=identity,
                )
            )

    # Embed -------------------------------------------------------------------------------------

    @grpc_errors
    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:
        ids = list(request.tokenized.input_ids)
        if not ids:
            raise InvalidRequest("Embed needs tokenized input")
        final: Any = None
        async with self.registry.track(request.request_id):
            with translated() as stage:
                async for output in self.engine.encode(
                    _engine.tokens_prompt(ids), _engine.embed_params(), request.request_id
                ):
                    stage.building_request = False
                    final = output
        if final is None or not getattr(final, "finished", True):
            raise ServicerError("the engine returned no embedding")
        data = final.outputs.data
        vector = [float(v) for v in (data.tolist() if hasattr(data, "tolist") else data)]
        return pb.EmbedResponse(embedding=vector, prompt_tokens=len(ids), embedding_dim=len(vector))

    # Information -------------------------------------------------------------------------------

    @grpc_errors
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        response = info.server_info(self.engine, len(self.registry), self.uptime_s())
        response.is_paused = await info.is_paused(self.engine)
        response.last_receive_timestamp = self.last_receive
        await self.multimodal.refresh()
        for name, value in self.multimodal.server_info().items():
            setattr(response, name, value)
        return response

    @grpc_errors
    async def GetLoads(self, request: pb.GetLoadsRequest, context: Context) -> pb.GetLoadsResponse:
        """One entry per managed DP rank with stats to trust (``info.loads``): a rank this engine
        does not manage is INVALID_ARGUMENT; a managed rank without stats is left out (an empty
        answer for ``dp_rank``), never reported idle. ``include`` is ignored: vLLM has only the
        core section."""
        rank = request.dp_rank if request.HasField("dp_rank") else None
        return info.loads(self.engine, self.loads.snapshot(), rank, _engine.VLLM_VERSION)

    # Administration ----------------------------------------------------------------------------

    @grpc_errors
    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: Context
    ) -> common_pb2.FlushCacheResponse:
        timeout = request.timeout_s
        if not math.isfinite(timeout) or timeout < 0:
            raise InvalidRequest("timeout_s must be a finite number >= 0")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or FLUSH_ATTEMPT_S)
        while True:
            remaining = deadline - loop.time()
            try:
                done = await asyncio.wait_for(self.engine.reset_prefix_cache(), max(remaining, 0.1))
            except TimeoutError:
                done = False
            if done:
                return common_pb2.FlushCacheResponse(success=True, message="prefix cache flushed")
            if timeout == 0:
                return common_pb2.FlushCacheResponse(
                    success=False, message="refused; requests may be in flight"
                )
            if loop.time() >= deadline:
                raise DeadlineExceeded("the prefix cache could not be flushed before timeout_s")
            await asyncio.sleep(0.1)

    @grpc_errors
    async def StartProfile(
        self, request: common_pb2.StartProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        fixed = [f.name for f, _ in request.ListFields()]
        if fixed:
            raise InvalidRequest(
                f"vLLM fixes {', '.join(fixed)} at launch (--profiler-config); leave them unset"
            )
        return await self._profile(self.engine.start_profile(), "profiler started")

    @grpc_errors
    async def StopProfile(
        self, request: common_pb2.StopProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        return await self._profile(self.engine.stop_profile(), "profiler stopped")

    async def _profile(self, call: Any, message: str) -> common_pb2.ProfileResponse:
        try:
            with translated():
                await asyncio.wait_for(call, PROFILE_TIMEOUT_S)
        except TimeoutError as exc:
            raise DeadlineExceeded("the profiler did not answer in time") from exc
        return common_pb2.ProfileResponse(success=True, message=message)

    @grpc_errors
    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: Context
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        sources = kv_events.kv_sources(self.engine)
        async for batch in subscription(
            request, context, sources, _KV_OFF, load_source=self._load_record, metrics=self.metrics
        ):
            yield batch

    def _load_record(self, rank: int) -> common_pb2.EngineLoad | None:
        """The load record stamped on ``rank``'s KV batches: its ``GetLoads`` entry, or none for
        a rank without one (no stats, or a publisher rank this frontend does not manage)."""
        if rank not in info.managed_ranks(self.engine):
            return None
        response = info.loads(self.engine, self.loads.snapshot(), rank, _engine.VLLM_VERSION)
        return kv_events.engine_load(response.loads[0]) if response.loads else None

"""The fake engine. Tokens are a deterministic function of the prompt and the step.

One engine loop steps every running request at once, and outputs go through a collector with
vLLM's merging semantics, so a reader that falls behind gets the steps it missed as one output,
as it does from vLLM (the servicer's coalescing is measured against that, not against an engine
that makes a token only when asked for one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from smg_servicer_core.testing.fake_engine import derived_token

DELTA, FINAL_ONLY = "DELTA", "FINAL_ONLY"


@dataclass
class FakeCompletion:
    index: int
    token_ids: list[int]
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletion]
    finished: bool
    num_cached_tokens: int = 0
    prompt_logprobs: Any = None
    kv_transfer_params: Any = None


@dataclass
class FakeSchedulerStats:
    """vLLM's ``SchedulerStats`` (``vllm.v1.metrics.stats``), the fields a load report reads; a
    fresh one is all zeros, as vLLM seeds its loggers with before the first engine step."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0


class FakeLoggingStatLogger:
    """vLLM's ``LoggingStatLogger``: one rank's (``engine_index``) latest stats, seeded with an
    empty ``SchedulerStats`` as vLLM does."""

    def __init__(self, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.last_scheduler_stats: Any = FakeSchedulerStats()

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.last_scheduler_stats = scheduler_stats


class FakeAggregatedLoggingStatLogger(FakeLoggingStatLogger):
    """vLLM's ``AggregatedLoggingStatLogger`` (``--aggregate-engine-logging``): every rank's
    latest stats in ``last_scheduler_stats_dict``; ``engine_index`` -1 and its own
    ``last_scheduler_stats`` the ranks' sum (what vLLM logs), never one rank's."""

    def __init__(self, engine_indexes: list[int]) -> None:
        super().__init__(engine_index=-1)
        self.engine_indexes = engine_indexes
        self.last_scheduler_stats_dict: dict[int, Any] = {
            idx: FakeSchedulerStats() for idx in engine_indexes
        }

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if engine_idx not in self.engine_indexes or scheduler_stats is None:
            return
        self.last_scheduler_stats_dict[engine_idx] = scheduler_stats
        ranks = list(self.last_scheduler_stats_dict.values())
        self.last_scheduler_stats = FakeSchedulerStats(
            num_running_reqs=sum(s.num_running_reqs for s in ranks),
            num_waiting_reqs=sum(s.num_waiting_reqs for s in ranks),
            num_skipped_waiting_reqs=sum(s.num_skipped_waiting_reqs for s in ranks),
            kv_cache_usage=sum(s.kv_cache_usage for s in ranks) / len(ranks),
        )


class FakePerEngineStatLoggerAdapter:
    """vLLM's ``PerEngineStatLoggerAdapter``: the default logging, one ``LoggingStatLogger`` per
    rank in ``per_engine_stat_loggers``."""

    def __init__(self, engine_indexes: list[int]) -> None:
        self.engine_indexes = engine_indexes
        self.per_engine_stat_loggers = {i: FakeLoggingStatLogger(i) for i in engine_indexes}

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        rank_logger = self.per_engine_stat_loggers.get(engine_idx)
        if rank_logger is not None:
            rank_logger.record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)


class FakePrometheusStatLogger:
    """vLLM's ``PrometheusStatLogger``: exports each rank's stats and keeps none to read back."""

    def __init__(self, engine_indexes: list[int]) -> None:
        self.engine_indexes = engine_indexes

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        return None


class FakeStatLoggerManager:
    """vLLM's ``StatLoggerManager`` (``AsyncLLM.logger_manager``, absent with
    ``--disable-log-stats``): the managed ranks (``engine_indexes``) and the stat loggers every
    ``record`` goes to, the default logging one (per rank, or aggregated) unless
    ``default_loggers`` is off (vLLM's logger below INFO), then Prometheus."""

    def __init__(
        self,
        engine_idxs: list[int] | None = None,
        *,
        aggregate_engine_logging: bool = False,
        default_loggers: bool = True,
    ) -> None:
        self.engine_indexes = engine_idxs if engine_idxs else [0]
        self.stat_loggers: list[Any] = []
        if default_loggers:
            self.stat_loggers.append(
                FakeAggregatedLoggingStatLogger(self.engine_indexes)
                if aggregate_engine_logging
                else FakePerEngineStatLoggerAdapter(self.engine_indexes)
            )
        self.stat_loggers.append(FakePrometheusStatLogger(self.engine_indexes))

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int | None = None,
    ) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.record(
                scheduler_stats, iteration_stats, mm_cache_stats, engine_idx=engine_idx or 0
            )


@dataclass
class FakeEngineCoreClient:
    """vLLM's engine client (``AsyncLLM.engine_core``, an ``MPClient``): the DP ranks it talks to
    (``engine_ranks_managed``)."""

    engine_ranks_managed: list[int]


@dataclass
class _Processor:
    running: set[str] = field(default_factory=set[str])

    def get_num_unfinished_requests(self) -> int:
        return len(self.running)


@dataclass
class _Run:
    """One request in the fake engine."""

    request_id: str
    ids: list[int]
    max_tokens: int
    delta: bool
    collector: _Collector
    done: list[list[int]]
    stop: asyncio.Event
    rank: int = 0
    step: int = 0


class _Collector:
    """vLLM's ``RequestOutputCollector`` semantics: the engine puts, the reader gets; DELTA
    outputs put while the reader is behind merge into one (ids appended per choice, the newest
    finish), an exception replaces whatever waits."""

    def __init__(self, aggregate: bool) -> None:
        self.aggregate = aggregate
        self.output: FakeRequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: FakeRequestOutput | BaseException) -> None:
        waiting = self.output
        if (
            waiting is None
            or isinstance(waiting, BaseException)
            or isinstance(output, BaseException)
        ):
            self.output = output
            self.ready.set()
            return
        if not self.aggregate:
            self.output = output
            return
        by_index = {c.index: c for c in waiting.outputs}
        for completion in output.outputs:
            merged = by_index.get(completion.index)
            if merged is None:
                waiting.outputs.append(completion)
                continue
            merged.token_ids.extend(completion.token_ids)
            merged.finish_reason = completion.finish_reason
            merged.stop_reason = completion.stop_reason
        waiting.finished = output.finished

    async def get(self) -> FakeRequestOutput:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


def _prompt_ids(prompt: Any) -> list[int]:
    """The ids of a ``TokensPrompt`` (a dict); a text prompt counts as one token."""
    try:
        return [int(t) for t in prompt["prompt_token_ids"]]
    except (TypeError, KeyError):
        return [1]


def _kind(params: Any) -> str:
    kind = getattr(params, "output_kind", DELTA)
    return str(getattr(kind, "name", kind))


class FakeAsyncLLM:
    def __init__(
        self,
        *,
        vocab_size: int = 4096,
        max_model_len: int = 2048,
        token_delay_s: float = 0.0,
        kv_events: tuple[str, str | None] | None = None,
        tokenizer: str = "",
        data_parallel_size: int = 1,
        log_stats: bool = True,
        aggregate_engine_logging: bool = False,
    ) -> None:
        """``kv_events``: (endpoint, replay endpoint) of a ZMQ publisher to report as this
        engine's KV-event publisher (a scripted one stands in for vLLM's).
        ``data_parallel_size``: the DP ranks this frontend manages (0..n-1, one process fronting
        them all); a request runs on its ``data_parallel_rank``, else on rank 0. ``log_stats``
        off is ``--disable-log-stats`` (no ``logger_manager``); ``aggregate_engine_logging``
        is vLLM's option of that name. After every step the engine records each rank's
        ``SchedulerStats`` (running requests, KV usage from their tokens) as vLLM's engine core
        does; a test may record its own through ``logger_manager.record``."""
        self.token_delay_s = token_delay_s
        self.errored = False
        #: ``(n, exc)``: raise ``exc`` from ``generate`` after ``n`` outputs (0: before any, as
        #: vLLM's own request checks do; later: a fault in the output stream).
        self.raise_after: tuple[int, BaseException] | None = None
        #: What ``reset_prefix_cache`` answers (vLLM refuses while requests hold blocks).
        self.flush_succeeds = True
        self.output_processor = _Processor()
        self.aborted: list[str] = []
        #: ``(request_id, kv_transfer_params, data_parallel_rank)`` of each rejection notice.
        self.rejected: list[tuple[str, dict[str, Any], int | None]] = []
        self._stops: dict[str, asyncio.Event] = {}
        self._runs: dict[str, _Run] = {}
        self._stepper: asyncio.Task[None] | None = None
        self._work = asyncio.Event()
        self.model_config = SimpleNamespace(
            model="fake-model",
            served_model_name="fake-model",
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            runner_type="generate",
            hf_config=SimpleNamespace(
                model_type="fake",
                architectures=["FakeForCausalLM"],
                eos_token_id=[2, 0],
                pad_token_id=3,
                bos_token_id=0,
            ),
            get_vocab_size=lambda: vocab_size,
            dtype="torch.float32",
        )
        ranks = list(range(data_parallel_size))
        self.engine_core = FakeEngineCoreClient(engine_ranks_managed=ranks)
        self.logger_manager: FakeStatLoggerManager | None = (
            FakeStatLoggerManager(ranks, aggregate_engine_logging=aggregate_engine_logging)
            if log_stats
            else None
        )
        self.vllm_config = SimpleNamespace(
            model_config=self.model_config,
            # kv_cache_size_tokens: vLLM 0.24+ sets it once the KV cache is sized (a model with
            # one KV-cache group: blocks x block size); delete it for an older release.
            cache_config=SimpleNamespace(
                block_size=16,
                num_gpu_blocks=1024,
                kv_cache_size_tokens=16 * 1024,
                cache_dtype="auto",
            ),
            scheduler_config=SimpleNamespace(max_num_seqs=256),
            parallel_config=SimpleNamespace(
                data_parallel_size=data_parallel_size, data_parallel_rank=0
            ),
            kv_events_config=None
            if kv_events is None
            else SimpleNamespace(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint=kv_events[0],
                replay_endpoint=kv_events[1],
                topic="",
                hwm=100_000,
            ),
        )

    async def check_health(self) -> None:
        if self.errored:
            raise RuntimeError("fake engine errored")

    async def notify_kv_transfer_request_rejected(
        self,
        request_id: str,
        kv_transfer_params: dict[str, Any],
        *,
        data_parallel_rank: int | None = None,
    ) -> None:
        self.rejected.append((request_id, dict(kv_transfer_params), data_parallel_rank))

    async def abort(self, request_id: str | list[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self.aborted.append(rid)
            stop = self._stops.get(rid)
            if stop is not None:
                stop.set()

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any,
        request_id: str,
        *,
        data_parallel_rank: int | None = None,
        **_: Any,
    ) -> AsyncIterator[FakeRequestOutput]:
        """vLLM's shape: one engine loop steps every running request at once (vLLM's engine core
        and output handler) and puts each step into the request's collector, which merges DELTA
        outputs while the reader is behind; the reader takes whatever is there."""
        ranks = int(self.vllm_config.parallel_config.data_parallel_size)
        if data_parallel_rank is not None and not 0 <= data_parallel_rank < ranks:
            # vLLM's input processor refuses it so (a VLLMValidationError, a ValueError)
            raise ValueError(
                f"data_parallel_rank {data_parallel_rank} is out of range [0, {ranks})."
            )
        n = int(getattr(sampling_params, "n", 1) or 1)
        run = _Run(
            request_id,
            _prompt_ids(prompt),
            sampling_params.max_tokens or 16,
            delta=_kind(sampling_params) == DELTA,
            collector=_Collector(_kind(sampling_params) == DELTA),
            done=[[] for _ in range(n)],
            stop=asyncio.Event(),
            rank=data_parallel_rank or 0,
        )
        self._stops[request_id] = run.stop
        self.output_processor.running.add(request_id)
        self._runs[request_id] = run
        self._start_stepping()
        try:
            while True:
                output = await run.collector.get()
                yield output
                if output.finished:
                    return
        finally:
            run.stop.set()
            self._runs.pop(request_id, None)
            self.output_processor.running.discard(request_id)
            self._stops.pop(request_id, None)

    def _start_stepping(self) -> None:
        loop = asyncio.get_running_loop()
        stepper = self._stepper
        if stepper is None or stepper.done() or stepper.get_loop() is not loop:
            self._stepper = loop.create_task(self._step_all())
        self._work.set()

    async def _step_all(self) -> None:
        """The engine: every ``token_delay_s`` one step of every running request."""
        while True:
            if not self._runs:
                self._work.clear()
                await self._work.wait()
            await asyncio.sleep(self.token_delay_s)
            vocab = int(self.model_config.get_vocab_size())
            stepped = False
            for run in list(self._runs.values()):
                stepped = stepped or not run.stop.is_set()
                if not self._step(run, vocab):
                    self._runs.pop(run.request_id, None)
            if stepped:
                self._record_stats()

    def _record_stats(self) -> None:
        """Each rank's ``SchedulerStats`` after a step, as vLLM's engine core sends them with its
        outputs: its running requests (those that finished in the step no longer count), nothing
        waiting (the fake admits every request at once), and its KV usage (the blocks its
        requests' tokens fill). Only after a step that ran a request: vLLM drops an aborted
        request without a step, so when the last running request is aborted its rank's last
        stats still count it."""
        if self.logger_manager is None:
            return
        cache = self.vllm_config.cache_config
        block_size, capacity = int(cache.block_size or 1), int(cache.num_gpu_blocks or 0)
        for rank in self.logger_manager.engine_indexes:
            runs = [r for r in self._runs.values() if r.rank == rank]
            blocks = -(-sum(len(r.ids) + r.step for r in runs) // block_size)
            usage = min(1.0, blocks / capacity) if capacity else 0.0
            stats = FakeSchedulerStats(num_running_reqs=len(runs), kv_cache_usage=usage)
            self.logger_manager.record(stats, None, engine_idx=rank)

    def _step(self, run: _Run, vocab: int) -> bool:
        """One step of ``run``; False once it has put its last output."""
        step = run.step
        run.step += 1
        if self.raise_after is not None and step == self.raise_after[0]:
            run.collector.put(self.raise_after[1])  # the engine's fault reaches the reader
            return False
        last = step == run.max_tokens - 1
        reason = "abort" if run.stop.is_set() else ("length" if last else None)
        n = len(run.done)
        tokens = [] if run.stop.is_set() else [derived_token(run.ids, step + 97 * i, vocab)
                                               for i in range(n)]  # fmt: skip
        for i, token in enumerate(tokens):
            run.done[i].append(token)
        if run.delta:
            completions = [
                FakeCompletion(i, [tokens[i]] if tokens else [], finish_reason=reason)
                for i in range(n)
            ]
            run.collector.put(
                FakeRequestOutput(run.request_id, run.ids, completions, finished=reason is not None)
            )
        elif reason is not None:
            completions = [FakeCompletion(i, run.done[i], finish_reason=reason) for i in range(n)]
            run.collector.put(FakeRequestOutput(run.request_id, run.ids, completions, True))
        return reason is None

    async def reset_prefix_cache(self, *_: Any) -> bool:
        return self.flush_succeeds

    # vLLM's pause API (AsyncLLM.pause_generation / resume_generation / is_paused, 0.27+): the
    # state only; a paused fake still steps (what pausing does to requests is vLLM's).
    paused: bool = False
    #: Fault injection: how long ``is_paused`` takes to answer (an engine core that hangs).
    pause_probe_delay_s: float = 0.0

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.paused = True

    async def resume_generation(self) -> None:
        self.paused = False

    async def is_paused(self) -> bool:
        if self.pause_probe_delay_s:
            await asyncio.sleep(self.pause_probe_delay_s)
        return self.paused

    async def start_profile(self) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

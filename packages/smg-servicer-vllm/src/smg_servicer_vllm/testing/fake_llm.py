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
    ) -> None:
        """``kv_events``: (endpoint, replay endpoint) of a ZMQ publisher to report as this
        engine's KV-event publisher (a scripted one stands in for vLLM's)."""
        self.token_delay_s = token_delay_s
        self.errored = False
        #: ``(n, exc)``: raise ``exc`` from ``generate`` after ``n`` outputs (0: before any, as
        #: vLLM's own request checks do; later: a fault in the output stream).
        self.raise_after: tuple[int, BaseException] | None = None
        #: What ``reset_prefix_cache`` answers (vLLM refuses while requests hold blocks).
        self.flush_succeeds = True
        self.output_processor = _Processor()
        self.aborted: list[str] = []
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
        self.vllm_config = SimpleNamespace(
            model_config=self.model_config,
            cache_config=SimpleNamespace(block_size=16, num_gpu_blocks=1024, cache_dtype="auto"),
            scheduler_config=SimpleNamespace(max_num_seqs=256),
            parallel_config=SimpleNamespace(data_parallel_size=1),
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

    async def abort(self, request_id: str | list[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self.aborted.append(rid)
            stop = self._stops.get(rid)
            if stop is not None:
                stop.set()

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **_: Any
    ) -> AsyncIterator[FakeRequestOutput]:
        """vLLM's shape: one engine loop steps every running request at once (vLLM's engine core
        and output handler) and puts each step into the request's collector, which merges DELTA
        outputs while the reader is behind; the reader takes whatever is there."""
        n = int(getattr(sampling_params, "n", 1) or 1)
        run = _Run(
            request_id,
            _prompt_ids(prompt),
            sampling_params.max_tokens or 16,
            delta=_kind(sampling_params) == DELTA,
            collector=_Collector(_kind(sampling_params) == DELTA),
            done=[[] for _ in range(n)],
            stop=asyncio.Event(),
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
            for run in list(self._runs.values()):
                if not self._step(run, vocab):
                    self._runs.pop(run.request_id, None)

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

    async def start_profile(self) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

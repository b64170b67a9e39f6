"""mlx-lm continuous batching on one engine thread. The only module that imports MLX.

Threading contract:
- every MLX object lives on the engine thread, which owns one ``BatchGenerator``;
- the event loop talks to it through an admission deque and an abort set, both under one lock;
  a ``threading.Event`` wakes the thread when it is idle; at most
  ``completion_batch_size + max_queue`` requests run or wait (beyond that RESOURCE_EXHAUSTED,
  which the router retries elsewhere);
- each decode step's outputs go back to the loop in **one** ``call_soon_threadsafe`` call that
  feeds every request's ``asyncio.Queue`` (per-token cost stays flat with batch size);
- an abort removes the uid from the batch before the next step, so the request stops within one
  decode step, and its queue receives a terminal ``abort`` output;
- a request's seed drives its own PRNG key: it never reseeds the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from smg_servicer_core.errors import Overloaded, Unavailable
from smg_servicer_core.stream import coalescing, take_waiting
from smg_servicer_mlx.model_info import ModelInfo
from smg_servicer_mlx.params import UNSERVABLE, GenParams

try:
    import mlx.core as mx
    from mlx_lm import load as mlx_load
    from mlx_lm.generate import BatchGenerator, StopSequences
    from mlx_lm.sample_utils import (
        apply_min_p,
        apply_top_k,
        apply_top_p,
        make_logits_processors,
    )
except ImportError as err:  # pragma: no cover - exercised by the lazy-import test
    raise ImportError(
        "smg-servicer-mlx needs MLX and mlx-lm: pip install 'smg-servicer-mlx[mlx]'"
    ) from err

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
#: Warm-up: one short generation per sampler kind, before SERVING (MLX compiles each graph on
#: first use; without it the first request pays ~2 s of TTFT on a CPU).
WARMUP_TOKENS = 2
WARMUP_MAX_STEPS = 64


@dataclass(frozen=True)
class StepOutput:
    token: int | None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None


@dataclass
class _Request:
    request_id: str
    params: GenParams
    queue: asyncio.Queue[StepOutput]
    uid: int | None = None
    done: bool = field(default=False)


def _greedy(logprobs: Any) -> Any:
    return mx.argmax(logprobs, axis=-1)


# BatchGenerator samples the whole batch in one call only when every row holds the *same* sampler
# object; otherwise it samples row by row. So requests with equal unseeded settings share one
# sampler (bounded cache); a seeded request needs its own PRNG key and gets its own.
_SHARED_SAMPLERS: dict[tuple[float, float, int, float], Callable[[Any], Any]] = {}
_SHARED_SAMPLERS_MAX = 256


def _sampler(params: GenParams) -> Callable[[Any], Any]:
    if params.temperature == 0:
        return _greedy
    if params.seed is not None:
        return _build_sampler(params)
    key = (params.temperature, params.top_p, params.top_k, params.min_p)
    shared = _SHARED_SAMPLERS.get(key)
    if shared is None:
        if len(_SHARED_SAMPLERS) >= _SHARED_SAMPLERS_MAX:
            _SHARED_SAMPLERS.clear()
        shared = _SHARED_SAMPLERS[key] = _build_sampler(params)
    return shared


def _build_sampler(params: GenParams) -> Callable[[Any], Any]:
    filters: list[Callable[[Any], Any]] = []
    if 0 < params.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0:
        filters.append(lambda x: apply_min_p(x, params.min_p, 1))
    if params.top_k > 0:
        filters.append(lambda x: apply_top_k(x, params.top_k))
    inverse_temp = 1.0 / params.temperature
    key = [mx.random.key(params.seed)] if params.seed is not None else None

    def sample(logprobs: Any) -> Any:
        for method in filters:
            logprobs = method(logprobs)
        if key is None:
            return mx.random.categorical(logprobs * inverse_temp)
        key[0], sub = mx.random.split(key[0])
        return mx.random.categorical(logprobs * inverse_temp, key=sub)

    return sample


def _processors(params: GenParams) -> list[Any]:
    return make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty if params.repetition_penalty != 1.0 else None,
        frequency_penalty=params.frequency_penalty or None,
        presence_penalty=params.presence_penalty or None,
    )


class MlxEngine:
    """Owns the engine thread. ``generate`` is called on the event loop."""

    def __init__(
        self,
        info: ModelInfo,
        *,
        completion_batch_size: int = 32,
        prefill_batch_size: int = 8,
        prefill_step_size: int = 2048,
        max_queue: int = 256,
        adapter_path: str | None = None,
        coalesce: bool | None = None,
    ) -> None:
        self.info = info
        #: Hand a stream every output waiting at once (core ``stream``; None: the setting).
        self.coalesce = coalescing() if coalesce is None else coalesce
        self._batch_sizes = (completion_batch_size, prefill_batch_size, prefill_step_size)
        self._adapter_path = adapter_path
        # Requests beyond the running batch wait inside BatchGenerator; bound them here.
        self._max_in_flight = completion_batch_size + max_queue
        self._lock = threading.Lock()
        self._pending: deque[_Request] = deque()
        self._aborts: set[str] = set()
        self._by_id: dict[str, _Request] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[None] | None = None
        self._dead: asyncio.Future[str] | None = None
        self._thread: threading.Thread | None = None
        self.tokenizer: Any = None
        #: The sampler kinds the warm-up ran, and how long it took (seconds).
        self.warmed: tuple[str, ...] = ()
        self.warmup_s = 0.0

    # lifecycle (core.server.EngineLifecycle) -------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._dead = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._ready is not None and self._ready.done() and not self.dead

    @property
    def dead(self) -> bool:
        return self._dead is not None and self._dead.done()

    async def wait_ready(self) -> None:
        if self._ready is None:
            self.start()
        assert self._ready is not None
        await asyncio.shield(self._ready)

    async def wait_dead(self) -> str:
        assert self._dead is not None, "start() first"
        return await asyncio.shield(self._dead)

    async def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    # requests (event loop) -------------------------------------------------------------------

    def load(self) -> tuple[int, int]:
        """(running, waiting): requests admitted into the batch, and queued ahead of it."""
        with self._lock:
            waiting = len(self._pending)
            return len(self._by_id) - waiting, waiting

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    async def generate(self, request_id: str, params: GenParams) -> AsyncIterator[list[StepOutput]]:
        """Outputs as they come; when the consumer fell behind, every output already waiting is
        returned together (one gRPC chunk instead of several: core ``stream``), so a slow reader
        costs fewer messages and nothing is held back while it keeps up."""
        if not self.ready:
            raise Unavailable("the MLX engine is not ready")
        request = _Request(request_id, params, asyncio.Queue())
        with self._lock:
            if len(self._by_id) >= self._max_in_flight:
                raise Overloaded(
                    f"the engine is full ({self._max_in_flight} requests running or waiting)"
                )
            self._pending.append(request)
            self._by_id[request_id] = request
        self._wake.set()
        queue = request.queue
        try:
            while True:
                batch = await take_waiting(queue, self.coalesce)
                yield batch
                if batch[-1].finish_reason is not None:
                    return
        finally:
            request.done = True

    async def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._by_id:
                self._aborts.add(request_id)
        self._wake.set()

    # engine thread ---------------------------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing left to tell
            self._loop.call_soon_threadsafe(fn, *args)

    def _run(self) -> None:
        try:
            generator = self._load()
        except Exception as exc:
            logger.exception("MLX engine failed to start")
            self._post(_settle_error, self._ready, exc)
            self._post(_settle, self._dead, f"start-up failed: {type(exc).__name__}")
            return
        self._post(_settle, self._ready, None)
        reason = "engine stopped"
        try:
            self._loop_steps(generator)
        except Exception as exc:
            logger.exception("MLX engine thread died")
            reason = f"engine thread died: {type(exc).__name__}"
        finally:
            generator.close()
            self._fail_all(reason)
        if not self._stopping:
            self._post(_settle, self._dead, reason)

    def _load(self) -> Any:
        loaded: Any = mlx_load(self.info.path, adapter_path=self._adapter_path)
        model, tokenizer = loaded[0], loaded[1]
        # Materialise lazily built arrays (RoPE frequencies, ...) on this thread's stream.
        mx.eval(model.parameters())  # pyright: ignore[reportUnknownMemberType]
        self.tokenizer = tokenizer
        completion, prefill, step = self._batch_sizes
        generator = BatchGenerator(
            model,
            completion_batch_size=completion,
            prefill_batch_size=prefill,
            prefill_step_size=step,
        )
        self._warm_up(generator)
        return generator

    def _warm_up(self, generator: Any) -> None:
        """One short generation per sampler kind this engine builds (greedy, shared
        categorical, seeded categorical, with a logits processor), all in one batch, before
        SERVING. Bounded in steps; its sequences are gone from the batch afterwards."""
        started = time.perf_counter()
        kinds = {
            "greedy": _greedy,
            "sampled": _build_sampler(_WARMUP_PARAMS),
            "seeded": _build_sampler(replace(_WARMUP_PARAMS, seed=0)),
        }
        vocab = self.info.vocab_size
        prompt = [min(self.info.bos_token_id, vocab - 1), *range(1, min(8, vocab))]
        uids = generator.insert(
            [prompt] * len(kinds),
            max_tokens=[WARMUP_TOKENS] * len(kinds),
            samplers=list(kinds.values()),
            logits_processors=[[], _processors(_WARMUP_PARAMS), []],
        )
        open_uids = set(uids)
        for _ in range(WARMUP_MAX_STEPS):
            if not open_uids:
                break
            _, responses = generator.next()
            for response in responses or ():
                if response.finish_reason is not None:
                    open_uids.discard(response.uid)
        if open_uids:  # never seen on a healthy model; do not leave them decoding
            generator.remove(sorted(open_uids))
        self.warmed = tuple(kinds)
        self.warmup_s = time.perf_counter() - started
        logger.info("engine warmed up (%s) in %.2fs", ", ".join(kinds), self.warmup_s)

    def _loop_steps(self, generator: Any) -> None:
        active: dict[int, _Request] = {}
        while True:
            with self._lock:
                if self._stopping:
                    return
                admitted = list(self._pending)
                self._pending.clear()
                aborted = self._aborts
                self._aborts = set()
            self._admit(generator, admitted, active)
            self._remove(generator, aborted, active)
            if not active:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            _, responses = generator.next()
            if responses:
                self._deliver(responses, active)

    def _admit(self, generator: Any, admitted: list[_Request], active: dict[int, _Request]) -> None:
        # Samplers are built here, on the engine thread (MLX arrays belong to a thread's stream),
        # one request at a time: a request whose sampling cannot be set up fails alone.
        built: list[tuple[_Request, Callable[[Any], Any], list[Any]]] = []
        refused: list[_Request] = []
        for request in admitted:
            try:
                built.append((request, _sampler(request.params), _processors(request.params)))
            except Exception:
                logger.exception("request %s: its sampling could not be set up", request.request_id)
                refused.append(request)
        if refused:
            self._finish(refused, UNSERVABLE)
        if not built:
            return
        params = [request.params for request, _, _ in built]
        uids = generator.insert(
            [p.prompt for p in params],
            max_tokens=[p.max_tokens for p in params],
            samplers=[sampler for _, sampler, _ in built],
            logits_processors=[processors for _, _, processors in built],
            stop_sequences=[StopSequences([[t] for t in sorted(p.stop_token_ids)]) for p in params],
        )
        for uid, (request, _, _) in zip(uids, built, strict=True):
            request.uid = uid
            active[uid] = request

    def _remove(self, generator: Any, aborted: set[str], active: dict[int, _Request]) -> None:
        if not aborted:
            return
        gone = [uid for uid, r in active.items() if r.request_id in aborted]
        if gone:
            generator.remove(gone)
            self._finish([active.pop(uid) for uid in gone], "abort")

    def _deliver(self, responses: list[Any], active: dict[int, _Request]) -> None:
        batch: list[tuple[_Request, StepOutput]] = []
        for response in responses:
            request = active.get(response.uid)
            if request is None:
                continue
            batch.append((request, self._output(request.params, response)))
            if response.finish_reason is not None:
                del active[response.uid]
                with self._lock:
                    self._by_id.pop(request.request_id, None)
        self._post(_dispatch, batch)

    @staticmethod
    def _output(params: GenParams, response: Any) -> StepOutput:
        token = int(response.token)
        if not params.want_logprobs:
            return StepOutput(token, finish_reason=response.finish_reason)
        logprobs: Any = response.logprobs
        chosen = float(logprobs[token].item())
        top: tuple[tuple[int, float], ...] = ()
        if params.logprobs > 0:
            n = params.logprobs
            ids: Any = mx.argpartition(-logprobs, kth=n - 1)[:n]
            id_list: list[int] = ids.tolist()
            value_list: list[float] = logprobs[ids].tolist()
            top = tuple(sorted(zip(id_list, value_list, strict=True), key=lambda p: -p[1]))
        return StepOutput(token, chosen, top, response.finish_reason)

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            waiting = list(self._by_id.values())
            self._by_id.clear()
            self._pending.clear()
        self._post(_dispatch, [(r, StepOutput(None, finish_reason="error")) for r in waiting])
        logger.info("engine thread ending: %s", reason)

    def _finish(self, requests: list[_Request], reason: str) -> None:
        """Ends requests out of the batch (aborted, or never admitted) with ``reason``."""
        with self._lock:
            for request in requests:
                self._by_id.pop(request.request_id, None)
        self._post(_dispatch, [(r, StepOutput(None, finish_reason=reason)) for r in requests])


_WARMUP_PARAMS = GenParams(
    prompt=[],
    max_tokens=WARMUP_TOKENS,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    repetition_penalty=1.1,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    logit_bias={},
    stop_token_ids=frozenset(),
    logprobs=0,
    want_logprobs=False,
    seed=None,
)


def _dispatch(batch: list[tuple[_Request, StepOutput]]) -> None:
    for request, output in batch:
        if not request.done:
            request.queue.put_nowait(output)


def _settle(future: asyncio.Future[Any] | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _settle_error(future: asyncio.Future[Any] | None, exc: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(exc)

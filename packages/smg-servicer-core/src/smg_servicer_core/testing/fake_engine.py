"""A scriptable fake engine: the engine boundary without an engine.

It imitates what a real engine adapter offers a servicer: an async generator of outputs per
request, an ``abort`` that ends that generator within one step, and the lifecycle ``serve()``
needs (``wait_ready`` / ``wait_dead`` / ``shutdown``). Tokens are deterministic (a function of the
prompt and the step), so tests can assert exact ids without a model.

Scripts set per request (by id) or for all requests: how many tokens, delays before the first
and between tokens, a fault after N tokens, and the finish reason. Every engine call is counted
(``abort_calls``, ``produced``) so tests can check that an abort reached the engine exactly once
and that the engine stopped producing tokens.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from smg_servicer_core.stream import take_waiting

logger = logging.getLogger(__name__)


class EngineFault(RuntimeError):
    """The error a script injects; its text must never reach a client."""


@dataclass(frozen=True)
class FakeScript:
    #: Exact tokens to emit; ``None`` derives them from the prompt.
    tokens: Sequence[int] | None = None
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    #: Raise :class:`EngineFault` after this many tokens.
    fail_after: int | None = None
    fault_message: str = "secret engine internals: /opt/model/weights.bin at 0xdeadbeef"
    #: Finish with ``stop`` on the last scripted token instead of ``length``.
    stop_on_last: bool = False
    cached_tokens: int = 0


@dataclass(frozen=True)
class FakeOutput:
    token_ids: list[int]
    finish_reason: str | None = None
    matched_stop_token_id: int | None = None


@dataclass
class _Running:
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def derived_token(prompt: Sequence[int], step: int, vocab_size: int) -> int:
    """The fake's deterministic next token; never an EOS id of the default vocabulary (0, 2)."""
    return 4 + (sum(prompt) * 31 + step * 7) % (vocab_size - 4)


class FakeEngine:
    def __init__(
        self,
        *,
        vocab_size: int = 4096,
        max_context: int = 2048,
        eos_token_ids: Sequence[int] = (2, 0),
        script: FakeScript | None = None,
        ready_delay_s: float = 0.0,
        shutdown_delay_s: float = 0.0,
        coalesce: bool = True,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.eos_token_ids = tuple(eos_token_ids)
        self.default_script = script or FakeScript()
        self.scripts: dict[str, FakeScript] = {}
        self.ready_delay_s = ready_delay_s
        #: How long ``shutdown`` takes (an engine stopping its worker processes).
        self.shutdown_delay_s = shutdown_delay_s
        self.abort_calls: Counter[str] = Counter()
        self.produced: Counter[str] = Counter()
        self.running: dict[str, _Running] = {}
        self.shutdown_calls = 0
        self._dead: asyncio.Future[str] | None = None
        self._ready = asyncio.Event()
        #: A reason here makes the health probe fail (None: healthy).
        self.unhealthy: str | None = None
        #: Hand a late reader every output it missed at once (core ``stream``).
        self.coalesce = coalesce

    # lifecycle -----------------------------------------------------------------------------

    def _dead_future(self) -> asyncio.Future[str]:
        if self._dead is None:
            self._dead = asyncio.get_running_loop().create_future()
        return self._dead

    async def wait_ready(self) -> None:
        if self.ready_delay_s:
            await asyncio.sleep(self.ready_delay_s)
        self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_dead(self) -> str:
        return await asyncio.shield(self._dead_future())

    def kill(self, reason: str = "fake engine killed") -> None:
        future = self._dead_future()
        if not future.done():
            future.set_result(reason)
        for running in self.running.values():
            running.stop.set()

    async def shutdown(self) -> None:
        self.shutdown_calls += 1
        for running in self.running.values():
            running.stop.set()
        if self.shutdown_delay_s > 0:
            logger.info("fake engine shutting down (%.1fs)", self.shutdown_delay_s)
            await asyncio.sleep(self.shutdown_delay_s)

    # requests ------------------------------------------------------------------------------

    def script_for(self, request_id: str) -> FakeScript:
        return self.scripts.get(request_id, self.default_script)

    async def abort(self, request_id: str) -> None:
        self.abort_calls[request_id] += 1
        running = self.running.get(request_id)
        if running is not None:
            running.stop.set()

    async def generate(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
    ) -> AsyncIterator[FakeOutput]:
        """The request's outputs. The engine steps on its own task, as a real engine does, and
        what a late reader missed comes as one output (core ``stream``; one per step when the
        engine's ``coalesce`` is off)."""
        running = _Running()
        self.running[request_id] = running
        queue: asyncio.Queue[FakeOutput | BaseException] = asyncio.Queue()
        steps = asyncio.ensure_future(
            self._steps(
                request_id,
                prompt_ids,
                max_tokens=max_tokens,
                stop_token_ids=stop_token_ids,
                running=running,
                queue=queue,
            )
        )
        try:
            while True:
                waiting = await take_waiting(queue, self.coalesce)
                outputs = [o for o in waiting if isinstance(o, FakeOutput)]
                fault = next((o for o in waiting if isinstance(o, BaseException)), None)
                if outputs:
                    last = outputs[-1]
                    yield FakeOutput(
                        [t for o in outputs for t in o.token_ids],
                        last.finish_reason,
                        last.matched_stop_token_id,
                    )
                    if last.finish_reason is not None:
                        return
                if fault is not None:
                    raise fault
        finally:
            steps.cancel()
            self.running.pop(request_id, None)

    async def _steps(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Sequence[int],
        running: _Running,
        queue: asyncio.Queue[FakeOutput | BaseException],
    ) -> None:
        script = self.script_for(request_id)
        tokens = list(script.tokens) if script.tokens is not None else None
        limit = min(max_tokens, len(tokens)) if tokens is not None else max_tokens
        try:
            if script.first_token_delay_s:
                await asyncio.sleep(script.first_token_delay_s)
            for step in range(limit):
                if step and script.token_delay_s:
                    await asyncio.sleep(script.token_delay_s)
                else:
                    await asyncio.sleep(0)  # one scheduling point per step, like a real engine
                if running.stop.is_set():
                    queue.put_nowait(FakeOutput([], finish_reason="abort"))
                    return
                if script.fail_after is not None and step >= script.fail_after:
                    raise EngineFault(script.fault_message)
                token = (
                    tokens[step]
                    if tokens is not None
                    else derived_token(prompt_ids, step, self.vocab_size)
                )
                self.produced[request_id] += 1
                if token in stop_token_ids:
                    queue.put_nowait(FakeOutput([token], "stop", matched_stop_token_id=token))
                    return
                if step == limit - 1:
                    finish = "stop" if script.stop_on_last else "length"
                    queue.put_nowait(FakeOutput([token], finish))
                    return
                queue.put_nowait(FakeOutput([token]))
            queue.put_nowait(FakeOutput([], "length"))  # nothing to generate
        except Exception as exc:  # the engine's fault reaches the reader after what it made
            queue.put_nowait(exc)

"""The tokenizer manager's role: scheduler sockets, per-request state, aborts, control requests.

Sockets (SGLang's own IPC names from ``PortArgs``; the schedulers connect, we bind):

- PUSH ``scheduler_input_ipc_name``: tokenized requests, ``AbortReq``, control requests;
- one PULL bound to both ``detokenizer_ipc_name`` (step outputs: there is no detokenizer process,
  the servicer streams token ids) and ``tokenizer_ipc_name`` (scheduler-side aborts, control
  replies, health signals).

Frames are SGLang's (msgspec msgpack, or pickle with ``SGLANG_USE_PICKLE_IPC=1``) through its own
``async_sock_send``/``async_sock_recv``.

Per-request state lives from :meth:`RequestManager.open` until the consumer leaves
:meth:`RequestManager.stream` (normally or not), so nothing outlives its call. Outputs for a
request wait in its state until read; the scheduler cannot be back-pressured, so that list holds
at most what the request can produce (its ``max_new_tokens``), and a reader that fell behind reads
everything waiting at once. Outputs for an unknown id (a request already aborted and gone) are
dropped.
"""

# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportAttributeAccessIssue=false

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from smg_servicer_core.errors import DeadlineExceeded, Unavailable
from smg_servicer_core.stream import coalescing
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang.convert import Output
from smg_servicer_sglang.engine_metrics import RequestMetrics

logger = logging.getLogger(__name__)

#: Silence with requests pending longer than this marks the scheduler stuck (NOT_SERVING).
STALL_AFTER_S = 30.0


@dataclass(slots=True)
class _State:
    rid: str
    wake: asyncio.Event
    outputs: list[Output] = field(default_factory=list)
    finished: bool = False


def _at(values: Any, i: int) -> Any:
    """``values[i]`` for SGLang's per-batch lists, which are empty when no request asked."""
    if values is None or i >= len(values):
        return None
    return values[i]


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values] if values is not None else []


def _rows(vals: Any, idxs: Any) -> list[tuple[list[float], list[int]]]:
    if not vals:
        return []
    return [
        ([float(v) for v in (row or [])], _ints(idx_row or []))
        for row, idx_row in zip(vals, idxs or [[] for _ in vals], strict=False)
    ]


def _token_output(batch: Any, i: int, drafts_per_verify: int = 0, times: Any = None) -> Output:
    """Request ``i`` of a ``BatchTokenIDOutput``. Speculative decoding as SGLang's tokenizer
    manager reports it: accepted = its correct drafts, proposed = verify steps x
    ``drafts_per_verify`` (:func:`._sglang.drafts_per_verify`); ``times``: the batch's
    scheduler time stats, unpickled (when SGLang's metrics are on)."""
    out = Output(
        token_ids=_ints(_at(batch.output_ids, i) or _at(batch.decode_ids, i)),
        finish=_at(batch.finished_reasons, i),
        prompt_tokens=int(_at(batch.prompt_tokens, i) or 0),
        completion_tokens=int(_at(batch.completion_tokens, i) or 0),
        cached_tokens=int(_at(batch.cached_tokens, i) or 0),
        reasoning_tokens=int(_at(batch.reasoning_tokens, i) or 0),
    )
    vals = _at(batch.output_token_logprobs_val, i)
    if vals:
        out.out_logprobs = [float(v) for v in vals]
        out.out_logprob_ids = _ints(_at(batch.output_token_logprobs_idx, i))
        out.out_top = _rows(
            _at(batch.output_top_logprobs_val, i), _at(batch.output_top_logprobs_idx, i)
        )
        out.out_ids_logprobs = _rows(
            _at(batch.output_token_ids_logprobs_val, i), _at(batch.output_token_ids_logprobs_idx, i)
        )
    in_vals = _at(batch.input_token_logprobs_val, i)
    if in_vals:
        out.in_logprobs = [None if v is None else float(v) for v in in_vals]
        out.in_logprob_ids = _ints(_at(batch.input_token_logprobs_idx, i))
        out.in_top = _rows(
            _at(batch.input_top_logprobs_val, i), _at(batch.input_top_logprobs_idx, i)
        )
    out.spec_accepted = int(_at(getattr(batch, "spec_num_correct_drafts", None), i) or 0)
    verify_steps = int(_at(getattr(batch, "spec_verify_ct", None), i) or 0)
    out.spec_drafts = verify_steps * drafts_per_verify
    out.spec_verify_steps = verify_steps
    stats = _at(times, i)
    out.prefill_done_at = float(getattr(stats, "prefill_finished_time", 0.0) or 0.0)
    return out


def _embedding_output(batch: Any, i: int) -> Output:
    vector = _at(batch.embeddings, i)
    return Output(
        token_ids=[],
        finish=_at(batch.finished_reasons, i) or {"type": "stop"},
        prompt_tokens=int(_at(batch.prompt_tokens, i) or 0),
        cached_tokens=int(_at(batch.cached_tokens, i) or 0),
        embedding=[float(v) for v in vector] if isinstance(vector, list) else None,
    )


class _Pending:
    """Replies awaited for one control request: one per DP rank."""

    def __init__(self, reply_type: type, expected: int) -> None:
        self.reply_type = reply_type
        self.expected = expected
        self.replies: list[Any] = []
        self.done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    def offer(self, reply: Any) -> None:
        self.replies.append(reply)
        if len(self.replies) >= self.expected and not self.done.done():
            self.done.set_result(self.replies)


class RequestManager:
    """Owns the scheduler sockets and the in-flight request states of one servicer process."""

    def __init__(
        self,
        port_args: Any,
        dp_size: int = 1,
        stall_after_s: float = STALL_AFTER_S,
        coalesce: bool | None = None,
        drafts_per_verify: int = 0,
    ) -> None:
        self.port_args = port_args
        #: Draft tokens a speculative verify step proposes (``spec_draft_tokens``' factor).
        self.drafts_per_verify = drafts_per_verify
        #: ``take`` hands over every output waiting (core ``stream``; None: the setting).
        self.coalesce = coalescing() if coalesce is None else coalesce
        self.dp_size = max(dp_size, 1)
        self.stall_after_s = stall_after_s
        self._ctx = zmq.asyncio.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.bind(port_args.scheduler_input_ipc_name)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(port_args.detokenizer_ipc_name)
        self._pull.bind(port_args.tokenizer_ipc_name)
        self._states: dict[str, _State] = {}
        self._groups: dict[str, list[str]] = {}
        self._control: list[_Pending] = []
        self._control_locks: dict[type, asyncio.Lock] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self.last_receive = time.time()
        #: When the current run of pending requests began (silence before it is not a stall).
        self._pending_since = self.last_receive
        self.failed: str | None = None
        self.closed = False
        #: SGLang's own per-request metrics, with ``--enable-metrics`` (:mod:`.engine_metrics`).
        self.metrics: RequestMetrics | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._receive_loop())

    async def close(self, reason: str = "server shutting down") -> None:
        """Fail every waiting request with ``reason``, stop the loop, close the sockets."""
        if self.closed:
            return
        self.closed = True
        for state in list(self._states.values()):
            self._finish_locally(state, {"type": "abort", "message": reason, "status_code": 503})
        for pending in self._control:
            if not pending.done.done():
                pending.done.set_exception(Unavailable(reason))
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._ctx.term()

    @property
    def active(self) -> int:
        return len(self._states)

    def stalled_for(self) -> float:
        """Seconds the scheduler has been silent while requests wait (0 when none wait)."""
        if not self._states:
            return 0.0
        return max(time.time() - max(self.last_receive, self._pending_since), 0.0)

    @property
    def stalled(self) -> bool:
        return self.stalled_for() > self.stall_after_s

    # -- requests ----------------------------------------------------------------------------

    async def send(self, obj: Any) -> None:
        """Send a request (whose state :meth:`open` created) or a control message."""
        if self.closed:
            raise Unavailable("server is shutting down; retry on another worker")
        async with self._send_lock:
            await sg.async_sock_send(self._push, obj)

    def open(
        self,
        rids: Iterable[str],
        group: str | None = None,
        *,
        stream: bool = False,
        grammar: bool = False,
    ) -> asyncio.Event:
        """Create the states for ``rids`` (woken through one shared event); ``stream`` and
        ``grammar`` label SGLang's own metrics of them (:attr:`metrics`)."""
        wake = asyncio.Event()
        rid_list = list(rids)
        if not self._states:
            self._pending_since = time.time()
        for rid in rid_list:
            self._states[rid] = _State(rid, wake)
            if self.metrics is not None:
                self.metrics.opened(rid, stream=stream, grammar=grammar)
        if group is not None:
            self._groups[group] = rid_list
        return wake

    async def release(self, rids: Iterable[str], group: str | None = None) -> None:
        """Forget the states of ``rids`` (every stream's cleanup). One the scheduler has not
        finished — the stream ended early: a client cancel, a deadline, an error — is aborted
        there first, so it does not go on generating for nobody. Shielded: a second cancel
        during cleanup does not lose the abort."""
        rid_list = list(rids)
        unfinished = [rid for rid in rid_list if not self._finished(rid)]
        for rid in rid_list:
            self._states.pop(rid, None)
            if self.metrics is not None:
                self.metrics.closed(rid)
        if group is not None:
            self._groups.pop(group, None)
        if unfinished:
            await asyncio.shield(self._abort_in_scheduler(unfinished))

    def is_open(self, rid: str) -> bool:
        """Whether ``rid`` is a request in flight here (opened, not released)."""
        return rid in self._states

    def _finished(self, rid: str) -> bool:
        state = self._states.get(rid)
        return state is None or state.finished

    async def _abort_in_scheduler(self, rids: list[str]) -> None:
        for rid in rids:
            with contextlib.suppress(Unavailable):
                await self.send(sg.AbortReq(rid=rid))

    def take(self, rid: str) -> tuple[list[Output], bool]:
        """Everything waiting for ``rid`` (one output when not coalescing) and whether it has
        finished (with nothing left to take)."""
        state = self._states.get(rid)
        if state is None:
            return [], True
        if self.coalesce or len(state.outputs) <= 1:
            outputs, state.outputs = state.outputs, []
            return outputs, state.finished
        outputs, state.outputs = state.outputs[:1], state.outputs[1:]
        return outputs, False

    def waiting(self, rid: str) -> int:
        """How many outputs of ``rid`` are not taken yet."""
        state = self._states.get(rid)
        return 0 if state is None else len(state.outputs)

    async def stream(self, rid: str) -> AsyncIterator[list[Output]]:
        """The outputs of one opened request, in batches, until it finishes."""
        state = self._states[rid]
        while True:
            outputs, finished = self.take(rid)
            if outputs:
                yield outputs
            if finished:
                return
            state.wake.clear()
            if not state.outputs and not state.finished:
                await state.wake.wait()

    async def abort(self, rid: str, message: str = "aborted") -> bool:
        """Abort ``rid`` (and its sub-requests for ``n > 1``) in the scheduler and end its stream
        locally at once. False when nothing with that id is in flight."""
        members = [m for m in self._groups.get(rid, [rid]) if not self._finished(m)]
        for member in members:
            self._finish_locally(self._states[member], {"type": "abort", "message": message})
        await self._abort_in_scheduler(members)
        return bool(members)

    def _finish_locally(self, state: _State, finish: dict[str, Any]) -> None:
        state.outputs.append(Output(token_ids=[], finish=finish))
        state.finished = True
        state.wake.set()

    # -- control requests --------------------------------------------------------------------

    async def control(self, request: Any, reply_type: type, timeout_s: float) -> list[Any]:
        """Send a control request and wait for one reply per DP rank."""
        # One outstanding request per reply type (replies carry no id to match them by); a
        # long profile does not hold up a cache flush.
        lock = self._control_locks.setdefault(reply_type, asyncio.Lock())
        async with lock:
            pending = _Pending(reply_type, self.dp_size)
            self._control.append(pending)
            try:
                await self.send(request)
                return await asyncio.wait_for(pending.done, timeout_s)
            except TimeoutError as exc:
                raise DeadlineExceeded(
                    f"the scheduler did not answer {type(request).__name__} in {timeout_s:.0f}s"
                ) from exc
            finally:
                self._control.remove(pending)

    _COMMUNICATORS: dict[str, type] = {
        "profile_communicator": sg.ProfileReqOutput,
        "flush_cache_communicator": sg.FlushCacheReqOutput,
    }

    async def send_communicator_req(
        self,
        req: Any,
        communicator_name: str,
        timeout: float = 30.0,  # noqa: ASYNC109 - SGLang's sidecar calls it with this name
    ) -> list[Any]:
        """SGLang's HTTP sidecar contract (``/start_profile``, ``/stop_profile``): send ``req``,
        return one reply per DP rank."""
        reply_type = self._COMMUNICATORS.get(communicator_name)
        if reply_type is None:
            raise ValueError(f"unknown communicator {communicator_name!r}")
        return await self.control(req, reply_type, timeout)

    # -- the receive loop --------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        try:
            while True:
                obj = await sg.async_sock_recv(self._pull)
                self.last_receive = time.time()
                self._dispatch(obj)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A frame we cannot decode means the wire changed under us: nothing after it can be
            # trusted, so every request fails and health reports the engine dead.
            logger.exception("scheduler receive loop failed")
            self.failed = f"scheduler stream unreadable ({type(exc).__name__})"
            for state in list(self._states.values()):
                self._finish_locally(
                    state, {"type": "abort", "message": "engine failure", "status_code": 500}
                )

    def _dispatch(self, obj: Any) -> None:
        if isinstance(obj, sg.BatchTokenIDOutput):
            times = None
            if self.metrics is not None:  # what SGLang's metrics read of the scheduler's clock
                try:
                    times = sg.unwrap_from_pickle(getattr(obj, "time_stats", None))
                except Exception as exc:  # observability never stops serving
                    self._metrics_failed(exc)
            for i, rid in enumerate(obj.rids or []):
                self._deliver(rid, lambda i=i: _token_output(obj, i, self.drafts_per_verify, times))
        elif isinstance(obj, sg.BatchEmbeddingOutput):
            for i, rid in enumerate(obj.rids or []):
                self._deliver(rid, lambda i=i: _embedding_output(obj, i))
        elif isinstance(obj, sg.AbortReq):
            state = self._states.get(obj.rid or "")
            if state is not None and not state.finished:
                finish = dict(obj.finished_reason or {})
                finish.setdefault("type", "abort")
                finish.setdefault("message", obj.abort_message or "aborted by the scheduler")
                self._finish_locally(state, finish)
        elif isinstance(obj, sg.HealthCheckOutput):
            pass  # the receive time above is the signal
        else:
            for pending in self._control:
                if isinstance(obj, pending.reply_type):
                    pending.offer(obj)
                    return
            logger.debug("ignoring scheduler message %s", type(obj).__name__)

    def _deliver(self, rid: str, build: Any) -> None:
        state = self._states.get(rid)
        if state is None or state.finished:
            return
        try:
            output: Output = build()
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            # One request's part of a batch we cannot read: that request fails, the rest go on.
            logger.exception("unreadable scheduler output for request %s", rid)
            self._finish_locally(
                state, {"type": "abort", "message": "engine output unreadable", "status_code": 500}
            )
            return
        state.outputs.append(output)
        if output.finish is not None:
            state.finished = True
        if self.metrics is not None:
            try:
                self.metrics.output(rid, output)
            except Exception as exc:  # observability never stops serving
                self._metrics_failed(exc)
        state.wake.set()

    def _metrics_failed(self, exc: Exception) -> None:
        logger.warning(
            "SGLang's own metrics stopped (%s); requests are served on", type(exc).__name__
        )
        self.metrics = None

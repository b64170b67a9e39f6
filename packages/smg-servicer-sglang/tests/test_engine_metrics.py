"""SGLang's tokenizer-side metrics driven per request as SGLang's tokenizer manager drives them
(``collect_metrics``), against a recording collector (the served families: core's
``test_metrics.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from smg_servicer_sglang.convert import Output
from smg_servicer_sglang.engine_metrics import RequestMetrics

pytestmark = pytest.mark.unit

LABELS = {"model_name": "m", "engine_type": "unified"}


class _Recorder:
    def __init__(self) -> None:
        self.labels = dict(LABELS)
        self.calls: list[tuple[Any, ...]] = []

    def observe_time_to_first_token(self, labels: dict[str, str], value: float, *, stream: bool):
        self.calls.append(("ttft", labels, value, stream))

    def observe_inter_token_latency(self, labels: dict[str, str], interval: float, new: int):
        self.calls.append(("itl", labels, interval, new))

    def observe_one_finished_request(self, labels: dict[str, str], *args: Any, **kw: Any):
        self.calls.append(("finished", labels, args, kw))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _out(tokens: int, finish: dict[str, Any] | None = None, **kw: Any) -> Output:
    return Output(token_ids=[1] * tokens, finish=finish, completion_tokens=tokens, **kw)


def test_a_request_is_counted_as_sglangs_tokenizer_manager_counts_it() -> None:
    recorder, clock = _Recorder(), _Clock()
    metrics = RequestMetrics(recorder, clock=clock)
    metrics.opened("r", stream=True, grammar=True)
    clock.now = 100.5
    metrics.output("r", _out(1))
    clock.now = 101.0
    metrics.output("r", _out(3))
    clock.now = 101.5
    metrics.output("r", _out(3))  # no new token: no gap observed
    clock.now = 102.0
    done = _out(4, {"type": "length"}, prompt_tokens=7, cached_tokens=2, spec_verify_steps=3)
    metrics.output("r", done)
    assert recorder.calls == [
        ("ttft", LABELS, 0.5, True),
        ("itl", LABELS, 0.5, 2),
        ("itl", LABELS, 1.0, 1),
        ("finished", LABELS, (7, 4, 2, 2.0, True), {"spec_verify_ct": 3, "is_streaming": True}),
    ]
    metrics.output("r", _out(5))  # after its end: nothing
    assert len(recorder.calls) == 4


class _Recorder523(_Recorder):
    """SGLang 0.5.23's collector: it takes the time per output token, and start-up timings."""

    def observe_one_finished_request(
        self, labels: dict[str, str], *args: Any, time_per_output_token: Any = None, **kw: Any
    ):
        self.calls.append(("finished", args, time_per_output_token))

    def emit_startup_time(self, timings: dict[str, Any]) -> None:
        self.calls.append(("startup", timings))


def test_the_time_per_output_token_where_sglang_takes_it() -> None:
    """Decode time over the tokens after the first, for a stop or length end; none for one
    token or an abort."""
    recorder, clock = _Recorder523(), _Clock()
    metrics = RequestMetrics(recorder, clock=clock)
    metrics.started({"load_weight": 1.0})
    metrics.started(None)  # ranks that report no timings: nothing
    for rid, tokens, finish in (("a", 4, "length"), ("b", 1, "stop"), ("c", 4, "abort")):
        metrics.opened(rid, stream=False, grammar=False)
        clock.now += 0.5
        metrics.output(rid, _out(1))
        clock.now += 1.5
        metrics.output(rid, _out(tokens, {"type": finish}))
    finished = [c[2] for c in recorder.calls if c[0] == "finished"]
    assert finished == [0.5, None, None]
    assert recorder.calls[0] == ("startup", {"load_weight": 1.0})


def test_a_non_streamed_requests_first_token_is_the_schedulers_prefill_end() -> None:
    """Its one output comes at its end: the first token is when the scheduler's prefill ended
    (its clock, if it falls within the request), as SGLang's tokenizer manager takes it."""
    recorder, clock = _Recorder523(), _Clock()
    metrics = RequestMetrics(recorder, clock=clock)
    metrics.opened("n", stream=False, grammar=False)
    clock.now = 102.0
    metrics.output("n", _out(4, {"type": "length"}, prefill_done_at=100.5))
    assert recorder.calls[0][:3] == ("ttft", LABELS, 0.5)
    assert recorder.calls[1][2] == 0.5  # (102 - 100.5) / 3 tokens after the first
    metrics.opened("late", stream=False, grammar=False)  # a stamp outside the request: not used
    clock.now = 103.0
    metrics.output("late", _out(2, {"type": "stop"}, prefill_done_at=99.0))
    assert recorder.calls[2][:3] == ("ttft", LABELS, 1.0)


def test_an_abort_has_no_first_token_and_a_prefill_worker_none_at_all() -> None:
    recorder = _Recorder()
    metrics = RequestMetrics(recorder, clock=_Clock())
    metrics.opened("a", stream=False, grammar=False)
    metrics.output("a", _out(0, {"type": "abort"}))
    assert [c[0] for c in recorder.calls] == ["finished"]
    prefill = RequestMetrics(recorder, prefill_only=True, clock=_Clock())
    prefill.opened("p", stream=False, grammar=False)
    prefill.output("p", _out(1, {"type": "length"}))
    assert [c[0] for c in recorder.calls] == ["finished", "finished"]


def test_a_request_closed_before_its_end_is_forgotten() -> None:
    recorder = _Recorder()
    metrics = RequestMetrics(recorder, clock=_Clock())
    metrics.opened("c", stream=True, grammar=False)
    metrics.closed("c")
    metrics.output("c", _out(1, {"type": "length"}))
    metrics.output("unknown", _out(1))
    assert recorder.calls == []

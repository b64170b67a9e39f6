"""SGLang's tokenizer-side metrics driven per request as SGLang's tokenizer manager drives them
(``collect_metrics``), against a recording collector; and the served families: the scheduler's
folder plus the collector's own metrics when this process counts in memory."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric

from smg_servicer_sglang.convert import Output
from smg_servicer_sglang.engine_metrics import RequestMetrics, SglangFamilies

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


def test_the_served_families_are_the_folders_and_the_collectors_own() -> None:
    class _Folder:
        def collect(self) -> list[Metric]:
            return [Metric("sglang:num_running_reqs", "running", "gauge")]

    class _Tokenizer:
        def __init__(self) -> None:
            self.labels = LABELS
            self.requests = Counter("sglang:num_requests", "requests", registry=CollectorRegistry())

    tokenizer = _Tokenizer()
    tokenizer.requests.inc(3)
    families = {m.name: m for m in SglangFamilies(_Folder(), tokenizer).collect()}
    assert set(families) == {"sglang:num_running_reqs", "sglang:num_requests"}
    assert [
        s.value for s in families["sglang:num_requests"].samples if s.name.endswith("_total")
    ] == [3]

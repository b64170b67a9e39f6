"""SGLang's own metrics in gRPC mode (``--enable-metrics``), as its HTTP server serves them.

Two halves, both SGLang's:

- the scheduler ranks' families (``sglang:num_running_reqs``, ``sglang:token_usage``...), which
  they write to ``PROMETHEUS_MULTIPROC_DIR``, collected as SGLang's HTTP server collects them;
- the tokenizer manager's (``sglang:num_requests_total``, ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:time_to_first_token_seconds``, the inter-token
  and end-to-end latencies...): our servicer holds the tokenizer manager's role, so
  :class:`RequestMetrics` drives SGLang's own ``TokenizerMetricsCollector`` per request, the
  way its ``collect_metrics`` does.

:class:`SglangFamilies` is what ``--metrics-port`` serves beside ``smg_servicer_*``
(:class:`smg_servicer_core.metrics.EngineMetrics`). Engine-free: the collector is handed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import values
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from smg_servicer_sglang.convert import Output


@dataclass(slots=True)
class _Request:
    start: float
    stream: bool
    grammar: bool
    first_seen: bool = False
    last: float = 0.0
    last_tokens: int = 0


class RequestMetrics:
    """One SGLang ``TokenizerMetricsCollector`` driven per request, as SGLang's tokenizer
    manager drives it: the time to the first output (not for an abort, nor on a prefill
    worker), the gap per new token after it, and at the end one finished request (prompt,
    generation and cached tokens, end to end, whether it had a grammar, speculative verify
    steps, streaming or not). A request that ends without a finished output (a client that left)
    is forgotten, as SGLang's is."""

    def __init__(
        self,
        collector: Any,
        *,
        prefill_only: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.collector = collector
        self.labels: dict[str, str] = dict(collector.labels)
        self.prefill_only = prefill_only
        self.clock = clock
        self._open: dict[str, _Request] = {}

    def opened(self, rid: str, *, stream: bool, grammar: bool) -> None:
        self._open[rid] = _Request(self.clock(), stream, grammar)

    def closed(self, rid: str) -> None:
        self._open.pop(rid, None)

    def output(self, rid: str, output: Output) -> None:
        request = self._open.get(rid)
        if request is None:
            return
        now = self.clock()
        finish = output.finish
        if not request.first_seen:
            aborted = finish is not None and finish.get("type") == "abort"
            if not aborted and not self.prefill_only:
                request.first_seen = True
                request.last, request.last_tokens = now, output.completion_tokens
                self.collector.observe_time_to_first_token(
                    self.labels, now - request.start, stream=request.stream
                )
        else:
            new_tokens = output.completion_tokens - request.last_tokens
            if new_tokens > 0:
                self.collector.observe_inter_token_latency(
                    self.labels, now - request.last, new_tokens
                )
                request.last, request.last_tokens = now, output.completion_tokens
        if finish is not None:
            del self._open[rid]
            self.collector.observe_one_finished_request(
                self.labels,
                output.prompt_tokens,
                output.completion_tokens,
                output.cached_tokens,
                now - request.start,
                request.grammar,
                spec_verify_ct=output.spec_verify_steps,
                is_streaming=request.stream,
            )


class SglangFamilies(Collector):
    """Every ``sglang:*`` family SGLang's HTTP server would serve: the multi-process folder's
    (``scheduler``: collected on each scrape) and the tokenizer collector's, read from its own
    metrics when this process counts in memory (it imported ``prometheus_client`` before
    ``PROMETHEUS_MULTIPROC_DIR`` was set; otherwise its counts are in the folder already)."""

    def __init__(self, scheduler: Collector, tokenizer: Any) -> None:
        self.scheduler = scheduler
        in_memory = values.ValueClass is values.MutexValue
        self.own: list[MetricWrapperBase] = (
            [m for m in vars(tokenizer).values() if isinstance(m, MetricWrapperBase)]
            if in_memory
            else []
        )

    def collect(self) -> Iterator[Any]:
        yield from self.scheduler.collect()
        for metric in self.own:
            yield from metric.collect()

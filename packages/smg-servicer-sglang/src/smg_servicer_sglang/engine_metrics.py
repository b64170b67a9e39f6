"""SGLang's own metrics in gRPC mode (``--enable-metrics``), as its HTTP server serves them.

Two halves, both SGLang's:

- the scheduler ranks' families (``sglang:num_running_reqs``, ``sglang:token_usage``...), which
  they write to ``PROMETHEUS_MULTIPROC_DIR``, collected as SGLang's HTTP server collects them;
- the tokenizer manager's (``sglang:num_requests_total``, ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:time_to_first_token_seconds``, the inter-token
  and end-to-end latencies...): our servicer holds the tokenizer manager's role, so
  :class:`RequestMetrics` drives SGLang's own ``TokenizerMetricsCollector`` per request, the
  way its ``collect_metrics`` does.

``--metrics-port`` serves both beside ``smg_servicer_*`` (core's ``EngineFamilies("sglang:",
multiprocess_folder())``). Engine-free: the collector is handed in.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smg_servicer_sglang.convert import Output


@dataclass(slots=True)
class _Request:
    start: float
    stream: bool
    grammar: bool
    first_seen: bool = False
    first: float = 0.0
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
        finished = inspect.signature(collector.observe_one_finished_request).parameters
        self._takes_tpot = "time_per_output_token" in finished

    def started(self, startup_time: dict[str, Any] | None) -> None:
        """The ranks' start-up timings (``sglang:startup_time_seconds``), as SGLang's tokenizer
        manager emits them once its schedulers are ready."""
        if startup_time is not None and hasattr(self.collector, "emit_startup_time"):
            self.collector.emit_startup_time(startup_time)

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
                # A non-streamed request's outputs come at its end: its first token is when
                # the scheduler's prefill ended, as SGLang's tokenizer manager takes it.
                done = output.prefill_done_at
                scheduled = not request.stream and request.start < done <= now
                request.first = done if scheduled else now
                request.last, request.last_tokens = now, output.completion_tokens
                self.collector.observe_time_to_first_token(
                    self.labels, request.first - request.start, stream=request.stream
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
            extra: dict[str, Any] = {}
            if self._takes_tpot:  # SGLang 0.5.23: decode time per token after the first
                extra["time_per_output_token"] = self._per_token(request, finish, output, now)
            self.collector.observe_one_finished_request(
                self.labels,
                output.prompt_tokens,
                output.completion_tokens,
                output.cached_tokens,
                now - request.start,
                request.grammar,
                spec_verify_ct=output.spec_verify_steps,
                is_streaming=request.stream,
                **extra,
            )

    def _per_token(
        self, request: _Request, finish: dict[str, Any], output: Output, now: float
    ) -> float | None:
        """SGLang's time per output token: decode time over the tokens after the first, for a
        request that ended by a stop or its length (not an abort), never on a prefill worker."""
        tokens = output.completion_tokens
        if not request.first_seen or tokens <= 1 or finish.get("type") not in ("stop", "length"):
            return None
        decode = now - request.first
        return decode / (tokens - 1) if decode > 0 else None

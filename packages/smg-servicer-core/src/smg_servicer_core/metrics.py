"""Prometheus metrics for a servicer, opt-in (``--metrics-port``), served on ``/metrics``.

One :class:`ServicerMetrics` per servicer is a ``prometheus_client`` collector. The hot path
(every streamed message) only touches plain Python numbers owned by the event loop; the exporter
thread turns them into metric families when scraped. That keeps the per-token cost of metrics to a
few attribute updates and one ``bisect`` (measured with ``tools/bench``; see core's README).

Names (all ``smg_servicer_*``, base units, bounded labels; never a request id):

| metric | type | labels |
|---|---|---|
| ``smg_servicer_rpc_requests_total`` | counter | ``rpc``, ``code`` (final gRPC status) |
| ``smg_servicer_rpc_duration_seconds`` | histogram | ``rpc`` |
| ``smg_servicer_generate_streams_in_flight`` | gauge | |
| ``smg_servicer_generate_time_to_first_token_seconds`` | histogram | |
| ``smg_servicer_generate_inter_chunk_seconds`` | histogram | |
| ``smg_servicer_generate_output_tokens_total`` | counter | |
| ``smg_servicer_generate_messages_total`` | counter | |
| ``smg_servicer_generate_chunk_tokens`` | histogram | (tokens per streamed chunk: coalescing) |
| ``smg_servicer_generate_aborts_total`` | counter | ``cause``: abort_rpc, client_cancel, error, |
| | | shutdown |
| ``smg_servicer_requests_refused_total`` | counter | ``reason``: the status code, lower case |
| ``smg_servicer_engine_running_requests`` | gauge | ``dp_rank`` (as ``GetLoads`` reports each |
| | | rank; "" when the engine reports no rank) |
| ``smg_servicer_engine_waiting_requests`` | gauge | ``dp_rank`` |
| ``smg_servicer_engine_kv_cache_usage_ratio`` | gauge | ``dp_rank`` |
| ``smg_servicer_kv_subscriptions`` | gauge | open ``SubscribeKvEvents`` streams |
| ``smg_servicer_kv_subscriptions_total`` | counter | |
| ``smg_servicer_kv_batches_total`` | counter | batches relayed |
| ``smg_servicer_kv_events_total`` | counter | events relayed |
| ``smg_servicer_kv_events_dropped_total`` | counter | ``reason`` (the normalizer's reasons) |
| ``smg_servicer_kv_replays_total`` | counter | replays that recovered history |
| ``smg_servicer_kv_resets_total`` | counter | ``code``: out_of_range, data_loss |
| ``smg_servicer_lora_adapters_loaded`` | gauge | adapters the engine holds (engines with LoRA) |
| ``smg_servicer_lora_updates_total`` | counter | ``op``: load, unload; ``outcome``: ok, refused, |
| | | failed (refused: the request's fault; failed: the engine's) |

Output tokens are the tokens delivered: a streamed chunk's ``token_ids``; a ``complete``'s
``output_ids`` only on a stream that sent no chunk (non-streaming requests). Time to first token is
from the call's start to its first message; inter-chunk gaps are between consecutive messages, as
the servicer hands them to gRPC. A refused request is one that ended before its first message with
a client-fault code, RESOURCE_EXHAUSTED or UNAVAILABLE (``shutting_down`` when the drain gate
refused it).
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from time import perf_counter
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, ProcessCollector, multiprocess, values
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from smg_servicer_core.config import environment

if TYPE_CHECKING:
    from smg_servicer_core.tls import ServerTls

logger = logging.getLogger(__name__)

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
#: Tokens per streamed chunk: 1 while a stream keeps up, more when it was behind (core ``stream``).
CHUNK_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

ABORT_CAUSES = ("abort_rpc", "client_cancel", "error", "shutdown")
#: Codes that mean "the request was turned away" when nothing was sent yet.
_REFUSAL_CODES = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
    }
)


@dataclass(frozen=True)
class EngineLoad:
    """What the engine gauges show for one data-parallel rank, as the servicer's ``GetLoads``
    reports it (``dp_rank`` None: a figure the engine gives for no rank in particular)."""

    running: float
    waiting: float
    kv_cache_usage: float
    dp_rank: int | None = 0


#: The engine's load per rank, read when ``/metrics`` is scraped (empty: the engine reports none;
#: a single load or None, what engines written for core 0.2.15 return, is read as one rank or none).
LoadsSource = Callable[[], Sequence[EngineLoad] | EngineLoad | None]


def rank_loads(rows: Iterable[Any]) -> list[EngineLoad]:
    """The gauges' loads from ``GetLoads``' per-rank rows (``SchedulerLoad``: ``dp_rank``,
    ``num_running_reqs``, ``num_waiting_reqs``, ``token_usage``), in rank order."""
    return sorted(
        (
            EngineLoad(
                running=r.num_running_reqs,
                waiting=r.num_waiting_reqs,
                kv_cache_usage=r.token_usage,
                dp_rank=int(r.dp_rank),
            )
            for r in rows
        ),
        key=lambda load: load.dp_rank or 0,
    )


class Histogram:
    """A histogram of plain numbers, updated by the event loop and read by the exporter."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last."""
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class _Call:
    """One RPC in flight: records its final status and duration."""

    __slots__ = ("metrics", "rpc", "start")

    def __init__(self, metrics: ServicerMetrics, rpc: str) -> None:
        self.metrics = metrics
        self.rpc = rpc
        self.start = perf_counter()

    def message(self, item: Any) -> None:
        """A streamed response was handed to gRPC."""

    def done(self, code: str) -> None:
        m = self.metrics
        m.rpc_requests[(self.rpc, code)] += 1
        hist = m.rpc_duration.get(self.rpc)
        if hist is None:
            hist = m.rpc_duration[self.rpc] = Histogram(RPC_BUCKETS)
        hist.observe(perf_counter() - self.start)


class _GenerateCall(_Call):
    """A ``Generate`` stream: tokens, messages, tokens per chunk, first-token time and gaps,
    refusals.

    ``message`` runs once per streamed message, so it inlines the chunk-size and gap histograms'
    updates (one ``bisect`` each into the shared counts) instead of calling through
    :meth:`Histogram.observe`.
    """

    __slots__ = ("chunk_tokens", "chunked", "gaps", "last", "messages", "tokens")

    def __init__(self, metrics: ServicerMetrics, rpc: str) -> None:
        super().__init__(metrics, rpc)
        self.last = 0.0
        self.messages = 0
        self.tokens = 0
        self.chunked = False
        self.gaps = metrics.inter_chunk
        self.chunk_tokens = metrics.chunk_tokens
        metrics.streams_in_flight += 1

    def message(self, item: Any) -> None:
        now = perf_counter()
        # A ``complete`` reads as an empty ``chunk``: one field access serves both kinds.
        tokens = len(item.chunk.token_ids)
        if tokens:
            self.chunked = True
            self.tokens += tokens
            sizes = self.chunk_tokens
            sizes.counts[bisect_left(sizes.bounds, tokens)] += 1
            sizes.total += tokens
        elif not self.chunked:  # non-streaming: the ids are in the ``complete``
            self.tokens += len(item.complete.output_ids)
        messages = self.messages
        if messages:
            gap = now - self.last
            gaps = self.gaps
            gaps.counts[bisect_left(gaps.bounds, gap)] += 1
            gaps.total += gap
        else:
            self.metrics.ttft.observe(now - self.start)
        self.messages = messages + 1
        self.last = now

    def done(self, code: str) -> None:
        m = self.metrics
        m.streams_in_flight -= 1
        m.output_tokens += self.tokens
        m.messages += self.messages
        if not self.messages and code in _REFUSAL_CODES:
            m.refused[code.lower()] += 1
        super().done(code)


class ServicerMetrics(Collector):
    """Every ``smg_servicer_*`` metric of one servicer (a ``prometheus_client`` collector)."""

    def __init__(self) -> None:
        self.rpc_requests: Counter[tuple[str, str]] = Counter()
        self.rpc_duration: dict[str, Histogram] = {}
        self.streams_in_flight = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_chunk = Histogram(GAP_BUCKETS)
        self.chunk_tokens = Histogram(CHUNK_TOKEN_BUCKETS)
        self.output_tokens = 0
        self.messages = 0
        self.aborts: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.loads_source: LoadsSource | None = None
        self.kv_open = 0
        self.kv_subscriptions = 0
        self.kv_batches = 0
        self.kv_events = 0
        self.kv_dropped: Counter[str] = Counter()
        self.kv_replays = 0
        self.kv_resets: Counter[str] = Counter()
        #: The adapters an engine holds (None: the engine serves no adapters; no family).
        self.lora_adapters: Callable[[], int] | None = None
        self.lora_updates: Counter[tuple[str, str]] = Counter()

    # -- recording (event loop) ------------------------------------------------------------

    def call(self, rpc: str) -> _Call:
        return _GenerateCall(self, rpc) if rpc == "Generate" else _Call(self, rpc)

    def abort(self, cause: str) -> None:
        self.aborts[cause] += 1

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1

    def kv_opened(self) -> None:
        self.kv_open += 1
        self.kv_subscriptions += 1

    def kv_closed(self) -> None:
        self.kv_open -= 1

    def kv_batch(self, events: int) -> None:
        self.kv_batches += 1
        self.kv_events += events

    def kv_drop(self, reason: str) -> None:
        self.kv_dropped[reason] += 1

    def kv_replay(self) -> None:
        self.kv_replays += 1

    def kv_reset(self, code: str) -> None:
        self.kv_resets[code] += 1

    def lora_update(self, op: str, outcome: str) -> None:
        """One adapter load or unload: ``op`` load/unload, ``outcome`` ok/refused/failed."""
        self.lora_updates[(op, outcome)] += 1

    # -- exporting (scrape thread) ---------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        yield from self._rpc_families()
        yield from self._generate_families()
        yield from self._engine_families()
        yield from self._kv_families()
        yield from self._lora_families()

    def _rpc_families(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "smg_servicer_rpc_requests", "RPCs by final status code", labels=["rpc", "code"]
        )
        for (rpc, code), value in sorted(self.rpc_requests.items()):
            requests.add_metric([rpc, code], value)
        yield requests
        duration = HistogramMetricFamily(
            "smg_servicer_rpc_duration_seconds", "RPC duration", labels=["rpc"]
        )
        for rpc, hist in sorted(self.rpc_duration.items()):
            duration.add_metric([rpc], hist.buckets(), hist.total)
        yield duration

    def _generate_families(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "smg_servicer_generate_streams_in_flight",
            "Generate calls in progress",
            value=self.streams_in_flight,
        )
        for name, doc, hist in (
            ("time_to_first_token", "Call start to first message", self.ttft),
            ("inter_chunk", "Gap between consecutive messages of a stream", self.inter_chunk),
        ):
            family = HistogramMetricFamily(f"smg_servicer_generate_{name}_seconds", doc)
            family.add_metric([], hist.buckets(), hist.total)
            yield family
        sizes = HistogramMetricFamily(
            "smg_servicer_generate_chunk_tokens",
            "Tokens per streamed chunk (more than one: the stream was behind the engine)",
        )
        sizes.add_metric([], self.chunk_tokens.buckets(), self.chunk_tokens.total)
        yield sizes
        yield CounterMetricFamily(
            "smg_servicer_generate_output_tokens", "Tokens delivered", value=self.output_tokens
        )
        yield CounterMetricFamily(
            "smg_servicer_generate_messages", "Generate messages sent", value=self.messages
        )
        aborts = CounterMetricFamily(
            "smg_servicer_generate_aborts", "Requests stopped early, by cause", labels=["cause"]
        )
        for cause in sorted(set(ABORT_CAUSES) | set(self.aborts)):
            aborts.add_metric([cause], self.aborts[cause])
        yield aborts
        refused = CounterMetricFamily(
            "smg_servicer_requests_refused", "Requests turned away, by reason", labels=["reason"]
        )
        for reason, value in sorted(self.refused.items()):
            refused.add_metric([reason], value)
        yield refused

    def _engine_families(self) -> Iterator[Metric]:
        if self.loads_source is None:
            return
        try:
            got = self.loads_source()
            ranks = [] if got is None else [got] if isinstance(got, EngineLoad) else list(got)
        except Exception:
            logger.warning("engine loads for /metrics failed", exc_info=True)
            return
        if not ranks:
            return
        for name, doc, field in (
            ("running_requests", "Requests the engine is running", "running"),
            ("waiting_requests", "Requests queued in the engine", "waiting"),
            ("kv_cache_usage_ratio", "Fraction of the KV cache in use", "kv_cache_usage"),
        ):
            family = GaugeMetricFamily(
                f"smg_servicer_engine_{name}", f"{doc}, per data-parallel rank", labels=["dp_rank"]
            )
            for load in ranks:
                rank = "" if load.dp_rank is None else str(load.dp_rank)
                family.add_metric([rank], getattr(load, field))
            yield family

    def _kv_families(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "smg_servicer_kv_subscriptions", "Open KV-event subscriptions", value=self.kv_open
        )
        for name, doc, value in (
            ("subscriptions", "KV-event subscriptions opened", self.kv_subscriptions),
            ("batches", "KV-event batches relayed", self.kv_batches),
            ("events", "KV events relayed", self.kv_events),
            ("replays", "Replays that recovered KV-event history", self.kv_replays),
        ):
            yield CounterMetricFamily(f"smg_servicer_kv_{name}", doc, value=value)
        for name, doc, label, counts in (
            ("events_dropped", "KV events dropped, by reason", "reason", self.kv_dropped),
            ("resets", "Subscriptions ended for lost history, by code", "code", self.kv_resets),
        ):
            family = CounterMetricFamily(f"smg_servicer_kv_{name}", doc, labels=[label])
            for key, value in sorted(counts.items()):
                family.add_metric([key], value)
            yield family

    def _lora_families(self) -> Iterator[Metric]:
        if self.lora_adapters is None:
            return
        yield GaugeMetricFamily(
            "smg_servicer_lora_adapters_loaded",
            "LoRA adapters the engine holds",
            value=self.lora_adapters(),
        )
        updates = CounterMetricFamily(
            "smg_servicer_lora_updates",
            "LoRA adapter loads and unloads, by outcome",
            labels=["op", "outcome"],
        )
        for op in ("load", "unload"):
            for outcome in ("ok", "refused", "failed"):
                updates.add_metric([op, outcome], self.lora_updates[(op, outcome)])
        yield updates


class EngineMetrics:
    """An engine's own Prometheus registry (vLLM's ``vllm:*``...), served beside ours exactly as
    the engine's HTTP server serves it: every family it holds, names and labels untouched.

    A registry that fails to collect (a multi-process folder being rewritten) leaves the scrape
    with our families; the failure is logged once, by its type."""

    def __init__(self, registry: Collector, engine: str) -> None:
        self.registry = registry
        self.engine = engine
        self._failed = False

    def names(self) -> set[str]:
        return {family.name for family in self.collect()}

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.registry.collect())
        except Exception as exc:
            if not self._failed:
                self._failed = True
                logger.warning(
                    "%s's own metrics could not be collected (%s); serving the servicer's",
                    self.engine,
                    type(exc).__name__,
                )
            return
        yield from families


class EngineFamilies(Collector):
    """An engine's own ``prefix`` families (``sglang:``, ``tokenspeed:``) as its HTTP server
    collects them, for engines that count in several processes: the multi-process folder's
    (``folder``: :func:`multiprocess_folder`, collected on each scrape; None: no folder) and this
    process's, read from ``registry`` when this process counts in memory (it imported
    ``prometheus_client`` before ``PROMETHEUS_MULTIPROC_DIR`` was set; otherwise its counts are
    in the folder already). Read as the folder reads: no ``_created`` samples, no family without
    a sample."""

    def __init__(
        self,
        prefix: str,
        folder: Collector | None,
        registry: Collector = REGISTRY,
        in_memory: bool | None = None,
    ) -> None:
        self.prefix = prefix
        self.folder = folder
        self.registry = registry
        self.in_memory = values.ValueClass is values.MutexValue if in_memory is None else in_memory

    def collect(self) -> Iterator[Metric]:
        if self.folder is not None:
            yield from self.folder.collect()
        if not self.in_memory:
            return
        for family in self.registry.collect():
            if not family.name.startswith(self.prefix):
                continue
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            if family.samples:
                yield family


def multiprocess_folder() -> Collector | None:
    """The families of ``PROMETHEUS_MULTIPROC_DIR`` (what an engine's processes write there),
    collected on each scrape; None when it is not set."""
    if "PROMETHEUS_MULTIPROC_DIR" not in environment():
        return None
    return multiprocess.MultiProcessCollector(None)  # pyright: ignore[reportArgumentType]


#: A scrape connection that sends nothing (or stalls its TLS handshake) is dropped after this.
SCRAPE_IDLE_S = 10.0


class MetricsServer:
    """``/metrics`` for one :class:`ServicerMetrics`, the process collector, and the engine's own
    metrics (:class:`EngineMetrics`) where the engine has them: plain HTTP, or HTTPS with the gRPC
    port's certificate (and its client CA) when that port has TLS (``tls``)."""

    def __init__(
        self,
        metrics: ServicerMetrics,
        host: str,
        port: int,
        engine: EngineMetrics | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        from prometheus_client import start_http_server  # noqa: PLC0415 - only when enabled

        self.metrics = metrics
        self.registry = CollectorRegistry()
        self.registry.register(metrics)
        engine_names = engine.names() if engine is not None else set[str]()
        if engine is not None:
            self.registry.register(engine)  # no describe(): its names are the engine's to keep
        if "process_cpu_seconds" not in engine_names:  # the engine's registry may hold its own
            ProcessCollector(registry=self.registry)
        try:
            if tls is not None and tls.https is not None:
                self._server, self._thread = _https_server(self.registry, host, port, tls.https)
            else:
                self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            from smg_servicer_core.errors import ConfigError  # noqa: PLC0415

            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from exc
        self.port: int = self._server.server_port
        scheme = "http" if tls is None else "https"
        logger.info("metrics on %s://%s:%d/metrics", scheme, host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _https_server(
    registry: CollectorRegistry, host: str, port: int, context: ssl.SSLContext
) -> tuple[WSGIServer, threading.Thread]:
    """``/metrics`` over TLS: each connection's handshake runs in its own thread (a client that
    stalls it holds only that thread, for :data:`SCRAPE_IDLE_S`), and a refused handshake is one
    log line, not a traceback."""
    from prometheus_client import (  # noqa: PLC0415 - only when enabled
        make_wsgi_app,  # pyright: ignore[reportUnknownVariableType]
    )

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

        def get_request(self) -> tuple[socket.socket, Any]:
            conn, address = super().get_request()
            conn.settimeout(SCRAPE_IDLE_S)
            return context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), (
                address
            )

        def handle_error(self, request: Any, client_address: Any) -> None:
            logger.info(
                "metrics: a scrape from %s ended (%s)",
                client_address[0],
                type(sys.exc_info()[1]).__name__,
            )

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

    app: Any = make_wsgi_app(registry)  # pyright: ignore[reportUnknownVariableType]
    server = make_server(host, port, app, Server, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, name="smg-metrics", daemon=True)
    thread.start()
    return server, thread

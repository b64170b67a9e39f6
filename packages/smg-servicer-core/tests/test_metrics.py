"""Prometheus metrics: exact counters after a known workload, drain refusals, flags and ports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc

from smg_servicer_core.cli import resolve_server, start_metrics
from smg_servicer_core.config import resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import EngineLoad, Histogram, MetricsServer, ServicerMetrics
from smg_servicer_core.testing import (
    FakeEngine,
    FakeEngineServicer,
    FakeScript,
    RunningServer,
    running_server,
)
from smg_servicer_core.testing.fake_servicer import SERVICE_NAME
from smg_servicer_core.testing.health import NOT_SERVING, SERVING, Watcher
from smg_servicer_core.testing.metrics import (
    assert_workload_counted,
    engine_gauge,
    metrics_workload,
    scrape,
    scrape_https,
    value,
)
from smg_servicer_core.testing.process import fake_server_command, free_port, spawn_with_port_file
from smg_servicer_core.testing.requests import mlx_generate


@pytest.mark.unit
def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    hist = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        hist.observe(v)
    assert hist.buckets() == [("0.1", 2.0), ("1.0", 3.0), ("+Inf", 4.0)]
    assert hist.count == 4
    assert hist.total == pytest.approx(2.65)


@pytest.mark.unit
def test_engine_gauges_are_per_data_parallel_rank() -> None:
    """One sample per rank the engine reports (``dp_rank``; "" for a figure of no rank); a
    single load or None (what an engine written for core 0.2.15 returns) reads as one rank or
    none; a source that fails leaves the gauges out."""

    def gauges(source: Any) -> dict[str, list[tuple[str, float]]]:
        metrics = ServicerMetrics()
        metrics.loads_source = source
        return {
            f.name: [(s.labels["dp_rank"], s.value) for s in f.samples]
            for f in metrics.collect()
            if f.name.startswith("smg_servicer_engine_")
        }

    two = gauges(lambda: [EngineLoad(2, 1, 0.5, dp_rank=0), EngineLoad(3, 0, 0.25, dp_rank=1)])
    assert two == {
        "smg_servicer_engine_running_requests": [("0", 2), ("1", 3)],
        "smg_servicer_engine_waiting_requests": [("0", 1), ("1", 0)],
        "smg_servicer_engine_kv_cache_usage_ratio": [("0", 0.5), ("1", 0.25)],
    }
    old = gauges(lambda: EngineLoad(4, 2, 0.0))
    assert old["smg_servicer_engine_running_requests"] == [("0", 4)]
    blind = gauges(lambda: [EngineLoad(1, 0, 0.0, dp_rank=None)])
    assert blind["smg_servicer_engine_waiting_requests"] == [("", 0)]
    assert gauges(lambda: None) == gauges(lambda: []) == gauges(lambda: 1 / 0) == {}


@pytest.mark.unit
def test_names_follow_prometheus_conventions() -> None:
    metrics = ServicerMetrics()
    metrics.call("Generate").done("OK")
    names = {family.name for family in metrics.collect()}
    assert all(name.startswith("smg_servicer_") for name in names)
    server = MetricsServer(metrics, "127.0.0.1", 0)
    try:
        samples = scrape(server.port)
    finally:
        server.close()
    sample_names = {name for name, _ in samples}
    assert "smg_servicer_generate_output_tokens_total" in sample_names
    assert "smg_servicer_rpc_duration_seconds_bucket" in sample_names
    assert "process_cpu_seconds_total" in sample_names
    labels = {dict(lbl).get("code") for name, lbl in samples if name.endswith("requests_total")}
    assert labels == {"OK"}


class _Broken:
    def collect(self) -> Any:
        raise OSError("a multi-process file being rewritten")


@pytest.mark.unit
def test_the_engines_own_registry_is_served_beside_ours(caplog: pytest.LogCaptureFixture) -> None:
    """Every family of the engine's registry, its names and labels untouched, beside ours; its
    process collector, when it has one, is the only one (no family twice); a registry that fails
    to collect leaves the scrape with ours, logged once by type."""
    from prometheus_client import CollectorRegistry, Counter, ProcessCollector

    from smg_servicer_core.metrics import EngineMetrics

    engine = CollectorRegistry()
    Counter("eng:prompt_tokens", "prompt tokens", ["model_name"], registry=engine).labels(
        model_name="m"
    ).inc(7)
    ProcessCollector(registry=engine)
    server = MetricsServer(ServicerMetrics(), "127.0.0.1", 0, EngineMetrics(engine, "Eng"))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as reply:
            text = reply.read().decode()
    finally:
        server.close()
    assert 'eng:prompt_tokens_total{model_name="m"} 7.0' in text
    assert text.count("# TYPE process_cpu_seconds_total counter") == 1
    assert "smg_servicer_generate_output_tokens_total" in text

    server = MetricsServer(ServicerMetrics(), "127.0.0.1", 0, EngineMetrics(_Broken(), "Eng"))
    try:
        first, second = scrape(server.port), scrape(server.port)
    finally:
        server.close()
    for samples in (first, second):
        assert "smg_servicer_generate_output_tokens_total" in {name for name, _ in samples}
        assert "process_cpu_seconds_total" in {name for name, _ in samples}  # ours, then
    failures = [r.getMessage() for r in caplog.records if "could not be collected" in r.message]
    assert failures == [
        "Eng's own metrics could not be collected (OSError); serving the servicer's"
    ]


@pytest.mark.unit
def test_metrics_are_off_without_the_flag_and_the_port_must_differ() -> None:
    assert start_metrics(resolve_server(None, {}, "fake")) is None
    resolved = resolve_server(None, {"SMG_FAKE_SERVICER_METRICS_PORT": "0"}, "fake")
    assert resolved.source("metrics_port") == "env"
    with pytest.raises(ConfigError, match="is the gRPC port"):
        same = {"SMG_SERVICER_PORT": "7000", "SMG_FAKE_SERVICER_METRICS_PORT": "7000"}
        resolve_server(None, same, "fake")
    with pytest.raises(ConfigError, match="TCP port"):
        resolve_server(None, {"SMG_FAKE_SERVICER_METRICS_PORT": "70000"}, "fake")


@dataclass
class Metered:
    servicer: FakeEngineServicer
    metrics: ServicerMetrics
    exporter: MetricsServer
    server: RunningServer
    stub: Any


@contextlib.asynccontextmanager
async def metered(token_delay_s: float) -> AsyncIterator[Metered]:
    """The fake servicer with metrics and their exporter, served through ``serve()``."""
    engine = FakeEngine(script=FakeScript(token_delay_s=token_delay_s))
    health = HealthFrame(SERVICE_NAME)
    metrics = ServicerMetrics()
    servicer = FakeEngineServicer(engine, health, metrics=metrics)
    exporter = MetricsServer(metrics, "127.0.0.1", 0)
    async with running_server(
        [servicer.binding()],
        health,
        engine,
        in_flight=lambda: len(servicer.registry),
        metrics_server=exporter,
    ) as srv:
        yield Metered(
            servicer, metrics, exporter, srv, mlx_engine_pb2_grpc.MlxEngineStub(srv.channel)
        )


@pytest.mark.contract
async def test_counters_match_a_known_workload_exactly() -> None:
    async with metered(0.005) as m:
        work = await metrics_workload(m.stub, "mlx", [5, 6, 7])
        samples = await asyncio.to_thread(scrape, m.exporter.port)
    assert work.codes == {"OK": 3, "INVALID_ARGUMENT": 1, "ABORTED": 1}
    assert work.tokens >= 12  # 3 x 4, plus what the aborted stream sent
    assert_workload_counted(samples, work)
    assert engine_gauge(samples, "running_requests") == 0
    assert value(samples, "smg_servicer_generate_inter_chunk_seconds_count") == work.messages - 4


@pytest.mark.contract
async def test_tokens_per_chunk_are_a_histogram() -> None:
    """Coalesced chunks (an engine that costs nothing outruns the stream) are counted by size."""
    async with metered(0.0) as m:
        call = m.stub.Generate(mlx_generate([4, 5], stream=True, max_tokens=64))
        sizes = [len(r.chunk.token_ids) async for r in call if r.HasField("chunk")]
        samples = await asyncio.to_thread(scrape, m.exporter.port)
    assert sum(sizes) == 64
    assert value(samples, "smg_servicer_generate_chunk_tokens_count") == len(sizes)
    assert value(samples, "smg_servicer_generate_chunk_tokens_sum") == 64
    ones = value(samples, "smg_servicer_generate_chunk_tokens_bucket", le="1.0")
    assert ones == sizes.count(1)


@pytest.mark.contract
async def test_client_cancel_and_drain_refusals_are_counted() -> None:
    async with metered(0.01) as m:
        servicer, metrics, srv, stub = m.servicer, m.metrics, m.server, m.stub
        stopped = asyncio.Event()

        def on_stop(cause: str) -> None:
            metrics.abort(cause)
            stopped.set()

        servicer.registry.on_stop = on_stop
        cancelled = stub.Generate(mlx_generate([1, 2], stream=True, max_tokens=500))
        await cancelled.read()
        cancelled.cancel()
        await asyncio.wait_for(stopped.wait(), 5)
        held = stub.Generate(mlx_generate([1, 2], stream=True, max_tokens=60))
        await held.read()
        watcher = Watcher(srv.channel)
        await watcher.until(SERVING)
        srv.stop_event.set()  # the SIGTERM path: the held stream drains
        await watcher.until(NOT_SERVING)
        watcher.close()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        while await held.read() is not grpc.aio.EOF:
            pass
        assert await held.code() == grpc.StatusCode.OK
    assert metrics.refused["shutting_down"] == 1
    assert metrics.aborts["client_cancel"] == 1
    assert metrics.rpc_requests[("Generate", "CANCELLED")] == 1
    assert metrics.rpc_requests[("Generate", "OK")] == 1
    assert metrics.streams_in_flight == 0


@pytest.mark.contract
def test_fake_server_process_serves_metrics_only_with_the_flag(tmp_path: Path) -> None:
    metrics_port = free_port()
    port_file = tmp_path / "port"
    cmd = fake_server_command(port_file, "--metrics-port", str(metrics_port))
    proc, grpc_port = spawn_with_port_file(cmd, port_file)
    try:
        samples = scrape(metrics_port)  # listening before the gRPC port was announced
        assert value(samples, "smg_servicer_generate_streams_in_flight") == 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    # The same server without the flag opens no metrics port.
    port_file.unlink()
    proc, _ = spawn_with_port_file(fake_server_command(port_file), port_file)
    try:
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    same = subprocess.run(
        [sys.executable, "-m", "smg_servicer_core.testing", "--port", str(grpc_port),
         "--metrics-port", str(grpc_port)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert same.returncode == 2
    assert "is the gRPC port" in same.stderr


@pytest.mark.unit
def test_metrics_follow_the_grpc_ports_tls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the gRPC port's TLS, ``/metrics`` is HTTPS with its certificate; with its client CA
    (mutual TLS) a scraper without a certificate of that CA is refused at the handshake (one log
    line, no traceback). A client that connects and sends nothing holds up no other scrape."""
    import socket
    import ssl

    from smg_servicer_core.testing.certs import mutual_tls
    from smg_servicer_core.tls import TLS_SETTINGS, load_server_tls

    caplog.set_level(logging.INFO, logger="smg_servicer_core.metrics")
    pki = mutual_tls(tmp_path)
    environ = {"SMG_SERVICER_SSL_CERTFILE": str(pki.server[0]),
               "SMG_SERVICER_SSL_KEYFILE": str(pki.server[1])}  # fmt: skip
    only_tls = load_server_tls(resolve(TLS_SETTINGS, None, environ))
    mutual = load_server_tls(
        resolve(TLS_SETTINGS, None, environ | {"SMG_SERVICER_SSL_CA_CERTS": str(pki.ca.cert)})
    )
    server = MetricsServer(ServicerMetrics(), "127.0.0.1", 0, tls=only_tls)
    try:
        assert "smg_servicer_generate_output_tokens_total" in scrape_https(server.port, pki.ca.cert)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            scrape(server.port)  # plain HTTP to a TLS port
    finally:
        server.close()
    server = MetricsServer(ServicerMetrics(), "127.0.0.1", 0, tls=mutual)
    try:
        with socket.create_connection(("127.0.0.1", server.port)):  # connects, sends nothing
            assert "smg_servicer_" in scrape_https(server.port, pki.ca.cert, pki.client)
        for client in (None, pki.stranger):
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                scrape_https(server.port, pki.ca.cert, client)
        deadline = time.monotonic() + 10  # the refusals are logged by the handler threads
        while len(_ended(caplog)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.close()
    ended = _ended(caplog)
    assert len(ended) >= 2 and all(line.endswith("Error)") for line in ended), ended
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a refused scrape"


def _ended(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "metrics: a scrape from" in r.message]


@pytest.mark.unit
def test_an_engines_families_are_its_folders_and_this_processs_own() -> None:
    """As the multi-process folder reads: no ``_created`` samples, no family without a sample,
    nothing but the engine's prefix of this process; none of this process's when it counts in
    the folder (multi-process mode)."""
    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.metrics_core import Metric

    from smg_servicer_core.metrics import EngineFamilies

    class _Folder:
        def collect(self) -> list[Metric]:
            return [Metric("sglang:num_running_reqs", "running", "gauge")]

    registry = CollectorRegistry()
    Counter("sglang:num_requests", "requests", registry=registry).inc(3)
    Counter("sglang:num_aborted_requests", "aborts", ["reason"], registry=registry)  # no sample
    Counter("vllm:other", "not the engine's", registry=registry).inc()
    families = {
        m.name: m
        for m in EngineFamilies("sglang:", _Folder(), registry, in_memory=True).collect()  # pyright: ignore[reportArgumentType]
    }
    assert set(families) == {"sglang:num_running_reqs", "sglang:num_requests"}
    samples = families["sglang:num_requests"].samples
    assert [(s.name, s.value) for s in samples] == [("sglang:num_requests_total", 3)]
    folder_only = EngineFamilies("sglang:", _Folder(), registry, in_memory=False).collect()  # pyright: ignore[reportArgumentType]
    assert [m.name for m in folder_only] == ["sglang:num_running_reqs"]
    no_folder = EngineFamilies("tokenspeed:", None, registry, in_memory=True).collect()
    assert list(no_folder) == []

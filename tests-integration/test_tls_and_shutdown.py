"""Locked doors on every engine: the worker's port speaks mutual TLS only (each launcher's
``--ssl-*`` flags), the real router reaches it through a TLS-originating sidecar holding the
router's client certificate (the router cannot speak TLS to gRPC workers itself:
:mod:`smg_it.tls_proxy`), and a stopping worker whose engine hangs in shutdown is cut at the
deadline (grace period + margin): the engine's processes are killed by PID, one line says so,
exit 1.

One worker per engine serves both halves: it is started with the engine's own shutdown call made
to hang (:mod:`smg_it.faults`), used for the TLS checks, then stopped."""

from __future__ import annotations

import re
import signal
import ssl
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.faults import ENGINE_SHUTDOWN, hang_env
from smg_it.harness import WORKERS, Router, Worker, free_port, metered_worker
from smg_it.tls_proxy import TlsOriginator
from smg_servicer_core.testing.certs import MutualTls, mutual_tls
from smg_servicer_core.testing.metrics import scrape, scrape_https
from smg_servicer_core.testing.requests import SERVICES, STUBS

pytestmark = pytest.mark.integration

ENGINES = sorted(STUBS)
GRACE_S = 1.0
MARGIN_S = 2.0
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> MutualTls:
    return mutual_tls(tmp_path_factory.mktemp("pki"))


def _credentials(pki: MutualTls, client: tuple[Path, Path] | None) -> grpc.ChannelCredentials:
    root = pki.ca.cert.read_bytes()
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=client[1].read_bytes(),
        certificate_chain=client[0].read_bytes(),
    )


def _check(channel: grpc.Channel, service: str) -> int:
    stub: Any = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def _wait_serving(worker: Worker, pki: MutualTls, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    target = f"127.0.0.1:{worker.port}"
    with grpc.secure_channel(target, _credentials(pki, pki.client)) as channel:
        while time.monotonic() < deadline:
            assert worker.proc is not None and worker.proc.poll() is None, worker.process.tail()  # type: ignore[union-attr]
            try:
                if _check(channel, worker.service) == SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    raise TimeoutError(f"{target} not SERVING over mutual TLS:\n{worker.process.tail()}")  # type: ignore[union-attr]


@pytest.fixture(scope="module", params=ENGINES)
def locked(
    request: pytest.FixtureRequest, pki: MutualTls, tiny_model: Path
) -> Iterator[tuple[str, Worker]]:
    engine: str = request.param
    worker = metered_worker(engine, tiny_model, free_port(), free_port(), *pki.server_flags())
    worker.env.update(hang_env(ENGINE_SHUTDOWN[engine]))
    worker.env.update(
        {
            "SMG_SERVICER_GRACE_PERIOD_S": str(GRACE_S),
            "SMG_SERVICER_SHUTDOWN_MARGIN_S": str(MARGIN_S),
        }
    )
    worker.start().wait_listening(worker.start_timeout_s)
    try:
        _wait_serving(worker, pki)
        yield engine, worker
    finally:
        if worker.proc is not None and worker.proc.poll() is None:
            for child in worker.process.children():  # type: ignore[union-attr]
                child.kill()
            worker.proc.kill()
            worker.proc.wait(10)


def test_the_router_serves_chat_over_mutual_tls(locked: tuple[str, Worker], pki: MutualTls) -> None:
    _, worker = locked
    with (
        TlsOriginator(("127.0.0.1", worker.port), pki) as sidecar,
        Router(sidecar.url) as router,
    ):
        model = httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]
        reply = httpx.post(
            router.base + "/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "Hi!"}],
                "max_tokens": 6,
                "temperature": 0,
            },
            timeout=120,
        )
    assert reply.status_code == 200, reply.text
    assert sidecar.connections > 0  # every byte went over the worker's TLS port
    usage = reply.json()["usage"]
    assert 0 < usage["completion_tokens"] <= 6 and usage["prompt_tokens"] > 0


def test_metrics_are_served_over_the_workers_mutual_tls(
    locked: tuple[str, Worker], pki: MutualTls
) -> None:
    """``/metrics`` follows the gRPC port's TLS: HTTPS with its certificate, a scraper with a
    client certificate of its CA served, one without (or with a stranger's) refused."""
    _, worker = locked
    assert worker.metrics_port is not None
    assert "smg_servicer_rpc_requests_total" in scrape_https(
        worker.metrics_port, pki.ca.cert, pki.client
    )
    for client in (None, pki.stranger):
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            scrape_https(worker.metrics_port, pki.ca.cert, client)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(worker.metrics_port)  # plain HTTP


@pytest.mark.parametrize("locked", ["mlx"], indirect=True)
def test_the_routers_own_tls_flags_do_not_reach_a_grpc_worker(
    locked: tuple[str, Worker], pki: MutualTls
) -> None:
    """Why the sidecar: the router (smg 1.13.0) given the worker as ``grpcs://`` and its own
    client certificate, key and CA (``--client-cert-path``, ``--client-key-path``,
    ``--ca-cert-paths``, which serve HTTP workers) cannot connect: its gRPC worker channel has no
    TLS. Evidence for the README; when a router release gains it, this fails and the sidecar can
    go. One engine is enough: the router never gets as far as the engine."""
    _, worker = locked
    failed = f"worker URL grpcs://127.0.0.1:{worker.port}: gRPC connection failed: transport error"
    router = Router(f"grpcs://127.0.0.1:{worker.port}", *pki.router_flags())
    process = router.start()
    try:
        deadline = time.monotonic() + 60
        while failed not in _plain(router.log.read_text()) and time.monotonic() < deadline:
            assert process.proc.poll() is None, process.tail()
            time.sleep(0.2)
        ready = httpx.get(router.base + "/readiness", timeout=5).status_code
    finally:
        router.stop()
    assert failed in _plain(router.log.read_text()), process.tail()
    assert ready != 200
    with grpc.secure_channel(f"127.0.0.1:{worker.port}", _credentials(pki, pki.client)) as good:
        assert _check(good, worker.service) == SERVING  # the same certificate, from a gRPC client


def _plain(log: str) -> str:
    """The router's log without its colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", log)


def test_clients_without_a_certificate_of_the_ca_are_refused_at_the_handshake(
    locked: tuple[str, Worker], pki: MutualTls
) -> None:
    engine, worker = locked
    target = f"127.0.0.1:{worker.port}"
    clients = {
        "no client certificate": grpc.secure_channel(target, _credentials(pki, None)),
        "another CA's certificate": grpc.secure_channel(target, _credentials(pki, pki.stranger)),
        "plain text": grpc.insecure_channel(target),
    }
    for what, channel in clients.items():
        with channel:
            for service in ("", SERVICES[engine]):  # grpc.health.v1 overall and the engine's
                with pytest.raises(grpc.RpcError) as refused:
                    _check(channel, service)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (what, service)  # type: ignore[attr-defined]
    with grpc.secure_channel(target, _credentials(pki, pki.client)) as good:
        assert _check(good, SERVICES[engine]) == SERVING  # the refusals harmed nothing


def test_a_hung_engine_shutdown_is_killed_at_the_deadline(locked: tuple[str, Worker]) -> None:
    """Runs last for its worker (it stops it)."""
    engine, worker = locked
    assert worker.process is not None
    children = worker.process.children()
    started = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    code = worker.proc.wait(120)  # type: ignore[union-attr]
    took = time.monotonic() - started
    log = worker.process.tail(100_000)
    assert code == 1, log
    assert "smg-test-hang:" in log, log  # the engine's shutdown really hung
    lines = [line for line in log.splitlines() if "shutdown passed its deadline" in line]
    assert len(lines) == 1, log
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], (alive, log)
    if children:
        assert any(str(p.pid) in lines[0] for p in children), lines[0]
    grace = 5.0 if engine == "vllm" else GRACE_S  # vLLM's launcher stops its server with 5 s
    assert took >= grace + MARGIN_S - 0.5, (took, log)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_key_that_is_not_the_certificates_exits_2_before_the_engine_starts(
    engine: str, pki: MutualTls, tiny_model: Path
) -> None:
    """Each launcher reads its TLS files before it starts the engine: a key that does not belong
    to the certificate is one error line and exit 2, no traceback."""
    cert, _ = pki.server
    _, wrong_key = pki.client
    worker = WORKERS[engine](
        tiny_model, free_port(), "--ssl-certfile", str(cert), "--ssl-keyfile", str(wrong_key)
    )
    process = worker.start()
    try:
        code = process.proc.wait(180)
    finally:
        if process.proc.poll() is None:
            process.proc.kill()
    log = process.tail(100_000)
    assert code == 2, log
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if "do not load as a PEM certificate" in line]
    assert len(errors) == 1, log

"""TLS on the gRPC port (core ``tls``) and the bounded shutdown (core ``shutdown``), on a real
server process with certificates made in the test."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import mlx_engine_pb2_grpc

from smg_servicer_core.config import resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.shutdown import ShutdownDeadline
from smg_servicer_core.testing import mlx_generate
from smg_servicer_core.testing.certs import CA, make_ca
from smg_servicer_core.testing.process import fake_server_command, spawn_with_port_file
from smg_servicer_core.tls import TLS_SETTINGS, load_server_tls

SERVING = health_pb2.HealthCheckResponse.SERVING


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca: CA = make_ca("worker-ca", root)
        self.server = self.ca.issue("127.0.0.1")
        self.client = self.ca.issue("router", client=True)
        self.other: CA = make_ca("other-ca", root)
        self.stranger = self.other.issue("stranger", client=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def _settings(**values: str | None) -> dict[str, str]:
    names = {s.name: s.env or "" for s in TLS_SETTINGS}
    return {names[k]: v for k, v in values.items() if v is not None}


def _load(**values: str | None) -> object:
    return load_server_tls(resolve(TLS_SETTINGS, None, _settings(**values)))


@pytest.mark.unit
def test_no_certificate_is_plain_text() -> None:
    assert _load() is None


@pytest.mark.unit
def test_every_bad_tls_configuration_is_a_config_error(pki: Pki, tmp_path: Path) -> None:
    cert, key = (str(p) for p in pki.server)
    other_cert, _ = pki.stranger
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    cases = {
        "needs --ssl-certfile and --ssl-keyfile": {"ssl_ca_certs": str(pki.ca.cert)},
        "go together": {"ssl_certfile": cert},
        "cannot read": {"ssl_certfile": cert, "ssl_keyfile": str(tmp_path / "missing.key")},
        "do not load as a PEM": {"ssl_certfile": str(other_cert), "ssl_keyfile": key},
        "not a PEM CA bundle": {
            "ssl_certfile": cert,
            "ssl_keyfile": key,
            "ssl_ca_certs": str(not_pem),
        },
    }
    for expected, values in cases.items():
        with pytest.raises(ConfigError, match=expected):
            _load(**values)


@pytest.mark.unit
def test_an_encrypted_key_needs_its_password_which_is_never_shown(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.server
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:s3cret-pw",
         "-out", str(encrypted)],
        check=True,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="give --ssl-keyfile-password"):
        _load(ssl_certfile=str(cert), ssl_keyfile=str(encrypted))
    with pytest.raises(ConfigError, match="does not decrypt") as refused:
        _load(ssl_certfile=str(cert), ssl_keyfile=str(encrypted), ssl_keyfile_password="wrong")
    assert "wrong" not in str(refused.value)
    resolved = resolve(
        TLS_SETTINGS,
        None,
        _settings(
            ssl_certfile=str(cert), ssl_keyfile=str(encrypted), ssl_keyfile_password="s3cret-pw"
        ),
    )
    assert "s3cret-pw" not in resolved.describe()
    tls = load_server_tls(resolved)
    assert tls is not None and b"ENCRYPTED" not in tls.private_key


@pytest.fixture(scope="module")
def tls_server(
    pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    folder = tmp_path_factory.mktemp("tls-server")
    cert, key = pki.server
    proc, port = spawn_with_port_file(
        fake_server_command(
            folder / "port",
            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
            "--ssl-ca-certs", str(pki.ca.cert),
        ),
        folder / "port",
        timeout_s=20,
    )  # fmt: skip
    yield proc, port
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def _credentials(pki: Pki, client: tuple[Path, Path] | None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.cert.read_bytes(),
        private_key=client[1].read_bytes(),
        certificate_chain=client[0].read_bytes(),
    )


async def _health(channel: grpc.aio.Channel) -> int:
    stub: Any = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


@pytest.mark.contract
async def test_mutual_tls_serves_a_client_certificate_of_its_ca(
    pki: Pki, tls_server: tuple[subprocess.Popen[bytes], int]
) -> None:
    _, port = tls_server
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", _credentials(pki, pki.client)) as ch:
        for _ in range(100):
            if await _health(ch) == SERVING:
                break
            await asyncio.sleep(0.05)
        assert await _health(ch) == SERVING
        stub = mlx_engine_pb2_grpc.MlxEngineStub(ch)
        replies = [r async for r in stub.Generate(mlx_generate([1, 2, 3]), timeout=10)]
        assert replies[-1].HasField("complete")


@pytest.mark.contract
async def test_mutual_tls_refuses_at_the_handshake(
    pki: Pki, tls_server: tuple[subprocess.Popen[bytes], int]
) -> None:
    """No client certificate, one from another CA, plain text: each is refused before any
    service answers, ``grpc.health.v1`` and the engine's service alike."""
    _, port = tls_server
    target = f"127.0.0.1:{port}"
    channels = {
        "no client certificate": grpc.aio.secure_channel(target, _credentials(pki, None)),
        "another CA's certificate": grpc.aio.secure_channel(
            target, _credentials(pki, pki.stranger)
        ),
        "plain text": grpc.aio.insecure_channel(target),
    }
    for what, channel in channels.items():
        async with channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _health(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, what
            stub = mlx_engine_pb2_grpc.MlxEngineStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                _ = [r async for r in stub.Generate(mlx_generate([1]), timeout=5)]
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, what


@pytest.mark.contract
def test_a_bad_tls_file_exits_2_with_one_line(pki: Pki, tmp_path: Path) -> None:
    cert, _ = pki.server
    done = subprocess.run(
        fake_server_command(
            tmp_path / "port", "--ssl-certfile", str(cert),
            "--ssl-keyfile", str(tmp_path / "no-such.key"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot read" in lines[0], done.stderr
    assert not (tmp_path / "port").exists()


@pytest.mark.unit
def test_the_deadline_kills_then_exits_1_and_a_disarmed_one_does_nothing() -> None:
    calls: list[object] = []
    deadline = ShutdownDeadline(
        0.05, 0.05, kill=lambda: calls.append("kill") or [4242], exit_process=calls.append
    )
    deadline.arm()
    assert deadline.expired.wait(5)
    for _ in range(100):
        if len(calls) == 2:
            break
        time.sleep(0.01)
    assert calls == ["kill", 1]
    quiet = ShutdownDeadline(
        0.05, 0.05, kill=lambda: calls.append("kill") or [], exit_process=calls.append
    )
    quiet.arm()
    quiet.disarm()
    time.sleep(0.3)
    assert not quiet.expired.is_set() and calls == ["kill", 1]


def _gone(process: psutil.Process) -> bool:
    for _ in range(100):
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.contract
def test_a_hung_engine_shutdown_is_cut_at_the_deadline(tmp_path: Path) -> None:
    """The engine's shutdown never ends: after the grace period plus the margin its process is
    killed by PID, one line says so, and the worker exits 1."""
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc, _ = spawn_with_port_file(
            fake_server_command(
                tmp_path / "port", "--engine-process", "--shutdown-delay-s", "3600",
                "--grace-period", "0.2", "--shutdown-margin", "1",
            ),
            tmp_path / "port",
            timeout_s=20,
            output=out,
        )  # fmt: skip
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 1
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 1, log.read_text()
        took = time.monotonic() - started
    text = log.read_text()
    assert took >= 1.2, text  # not before grace + margin
    assert _gone(children[0]), text
    lines = [line for line in text.splitlines() if "passed its deadline" in line]
    assert len(lines) == 1, text
    assert f"engine processes {children[0].pid}" in lines[0]

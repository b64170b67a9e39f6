"""core.testing.certs: the certificates hold up in a real TLS handshake (Python's ssl, OpenSSL):
a server certificate verifies against its CA for 127.0.0.1 and localhost, not against another
CA nor for another name; a client certificate passes a server that demands one, while a server
certificate used as a client's (wrong key usage) and a client of another CA are refused."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from smg_servicer_core.testing.certs import CA, make_ca

pytestmark = pytest.mark.unit


def _handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, host: str = "127.0.0.1"
) -> str | None:
    """One handshake over loopback; ``None`` when both sides agree, else the client's error
    (or the server's, when the client saw none)."""
    server_error: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as exc:
                server_error.append(str(exc))
            finally:
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                client_ctx.wrap_socket(raw, server_hostname=host) as tls,
            ):
                tls.sendall(b"x")
                tls.recv(1)  # TLS 1.3: the server's verdict on our certificate comes here
        except (ssl.SSLError, OSError) as exc:
            return str(exc)
        finally:
            thread.join(5)
    return server_error[0] if server_error else None


def _server(ca: CA, cert: Path, key: Path, *, demand_client: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    if demand_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(ca.cert)
    return ctx


def _client(ca: CA, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    if cert is not None and key is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def test_a_server_certificate_verifies_for_its_names_against_its_ca_only(tmp_path: Path) -> None:
    ca, other = make_ca("test-ca", tmp_path), make_ca("other-ca", tmp_path)
    cert, key = ca.issue("127.0.0.1", sans=("127.0.0.1", "localhost"))
    assert cert.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" in key.read_text()
    server = _server(ca, cert, key)
    assert _handshake(server, _client(ca)) is None
    assert _handshake(server, _client(ca), host="localhost") is None
    assert "certificate verify failed" in (_handshake(server, _client(other)) or "")
    wrong_name = _handshake(server, _client(ca), host="example.com")
    assert "certificate verify failed" in (wrong_name or "")


def test_client_certificates_pass_a_server_that_demands_them_from_its_ca_only(
    tmp_path: Path,
) -> None:
    ca, other = make_ca("test-ca", tmp_path), make_ca("other-ca", tmp_path)
    server = _server(ca, *ca.issue("127.0.0.1"), demand_client=True)
    assert _handshake(server, _client(ca, *ca.issue("client", client=True))) is None
    assert _handshake(server, _client(ca)) is not None  # no certificate
    assert _handshake(server, _client(ca, *other.issue("client", client=True))) is not None
    # a server certificate (serverAuth only) is not a client certificate
    assert _handshake(server, _client(ca, *ca.issue("not-a-client", stem="srv2"))) is not None


def test_files_land_in_the_given_folder_and_two_cas_are_unrelated(tmp_path: Path) -> None:
    first, second = make_ca("ca one", tmp_path / "a"), make_ca("ca one", tmp_path / "b")
    assert first.cert.parent == tmp_path / "a" and first.cert.name == "ca_one.pem"
    assert first.cert.read_bytes() != second.cert.read_bytes()
    cert, key = first.issue("worker", client=True)
    assert (cert.name, key.name) == ("ca_one-worker-client.pem", "ca_one-worker-client.key")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        ["ca_one.pem", "ca_one.key", cert.name, key.name]
    )
    with pytest.raises(ValueError, match="common name"):
        first.issue("a/b")

"""TLS and mutual TLS for a worker's gRPC port.

| flag | variable | meaning |
|---|---|---|
| ``--ssl-certfile`` | ``SMG_SERVICER_SSL_CERTFILE`` | PEM certificate chain: TLS only |
| ``--ssl-keyfile`` | ``SMG_SERVICER_SSL_KEYFILE`` | PEM private key of the certificate |
| ``--ssl-ca-certs`` | ``SMG_SERVICER_SSL_CA_CERTS`` | PEM CA bundle: client certificates required |
| ``--ssl-keyfile-password`` | ``SMG_SERVICER_SSL_KEYFILE_PASSWORD`` | an encrypted key's |

The worker's ``/metrics`` port (``--metrics-port``) follows the gRPC port: HTTPS with the same
certificate, and client certificates required when ``--ssl-ca-certs`` is given
(``ServerTls.https``).

The names are SGLang's and vLLM's own (``--ssl-*``); each launcher honours its engine's flags and
falls back to the variables. Everything is read and checked at start (:func:`load_server_tls`): a
missing or unreadable file, a key that does not match its certificate, an encrypted key without
its password or a CA bundle that does not parse is a :class:`ConfigError` (exit 2, one line). With
a CA bundle, a client without a certificate, with one from another CA, or speaking plain text is
refused at the handshake, on every service of the port (``grpc.health.v1`` included).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from smg_servicer_core.config import ResolvedSettings, Setting, resolve
from smg_servicer_core.errors import ConfigError

CERTFILE = Setting(
    "ssl_certfile",
    str,
    None,
    "PEM certificate chain: serve gRPC over TLS only",
    flag="--ssl-certfile",
    env="SMG_SERVICER_SSL_CERTFILE",
)
KEYFILE = Setting(
    "ssl_keyfile",
    str,
    None,
    "PEM private key of --ssl-certfile",
    flag="--ssl-keyfile",
    env="SMG_SERVICER_SSL_KEYFILE",
)
CA_CERTS = Setting(
    "ssl_ca_certs",
    str,
    None,
    "PEM CA bundle: clients must present a certificate it signed (mutual TLS)",
    flag="--ssl-ca-certs",
    env="SMG_SERVICER_SSL_CA_CERTS",
)
KEYFILE_PASSWORD = Setting(
    "ssl_keyfile_password",
    str,
    None,
    "password of an encrypted --ssl-keyfile",
    flag="--ssl-keyfile-password",
    env="SMG_SERVICER_SSL_KEYFILE_PASSWORD",
    secret=True,
)
TLS_SETTINGS: tuple[Setting[Any], ...] = (CERTFILE, KEYFILE, CA_CERTS, KEYFILE_PASSWORD)


@dataclass(frozen=True, repr=False)
class ServerTls:
    """The PEM bytes a secure port is built from (read once, at start)."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None
    certfile: str
    ca_certs: str | None
    #: The same certificate (and client CA) for an HTTPS port beside the gRPC one (``/metrics``).
    https: ssl.SSLContext | None = field(default=None, compare=False)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )

    def describe(self) -> str:
        if self.client_ca is None:
            return f"TLS ({self.certfile})"
        return f"mutual TLS ({self.certfile}; client certificates signed by {self.ca_certs})"


def resolve_tls(namespace: Any, environ: Mapping[str, str]) -> ServerTls | None:
    """The TLS settings of ``namespace`` (an engine's own ``ssl_*`` attributes or our flags),
    else the variables, loaded and checked; None when no certificate is configured."""
    return load_server_tls(resolve(TLS_SETTINGS, namespace, environ))


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read {path}: {exc.strerror or 'unreadable'}") from None


def _decrypt(key: bytes, password: str) -> bytes:
    """grpc takes only an unencrypted PEM key: decrypt it in memory."""
    try:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - optional
    except ImportError:
        raise ConfigError(
            "--ssl-keyfile is encrypted: decrypting it needs the 'cryptography' package "
            "(pip install 'smg-servicer-core[tls]')"
        ) from None
    try:
        loaded = serialization.load_pem_private_key(key, password.encode())
    except (TypeError, ValueError):
        raise ConfigError("--ssl-keyfile: the key does not decrypt with its password") from None
    return loaded.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_server_tls(resolved: ResolvedSettings) -> ServerTls | None:
    """Read and check the files the settings name (see the module's table)."""
    certfile, keyfile = resolved[CERTFILE.name], resolved[KEYFILE.name]
    ca_certs, password = resolved[CA_CERTS.name], resolved[KEYFILE_PASSWORD.name]
    if not certfile and not keyfile:
        if ca_certs:
            raise ConfigError("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile")
        return None
    if not certfile or not keyfile:
        raise ConfigError("--ssl-certfile and --ssl-keyfile go together: give both")
    chain, key = _read(certfile, "--ssl-certfile"), _read(keyfile, "--ssl-keyfile")
    client_ca = _read(ca_certs, "--ssl-ca-certs") if ca_certs else None
    if b"ENCRYPTED" in key:
        if not password:
            raise ConfigError("--ssl-keyfile is encrypted: give --ssl-keyfile-password")
        key = _decrypt(key, password)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=password or None)
    except ssl.SSLError:
        raise ConfigError(
            f"--ssl-certfile {certfile} and --ssl-keyfile {keyfile} do not load as a PEM "
            "certificate and its private key"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_certs:
        try:
            context.load_verify_locations(cafile=ca_certs)
        except ssl.SSLError:
            raise ConfigError(f"--ssl-ca-certs {ca_certs} is not a PEM CA bundle") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return ServerTls(chain, key, client_ca, certfile, ca_certs, https=context)

"""Certificates for TLS tests, made in the test: a CA, and server or client certificates it
signs, each a PEM file in a folder the test owns.

    ca = make_ca("test-ca", tmp_path)
    cert, key = ca.issue("127.0.0.1", sans=("127.0.0.1", "localhost"))
    client_cert, client_key = ca.issue("client", client=True)
    other = make_ca("other-ca", tmp_path)   # an unrelated CA: its certificates must be refused

Made with the ``openssl`` command line (Debian's ``openssl`` package), not a Python library:
every test environment here has it (the workspace's ``.venv``, SGLang's and TokenSpeed's), and
the certificates it writes are what operators write. Keys are EC P-256 (PKCS#8 PEM, no
passphrase), accepted by OpenSSL (redis-server), BoringSSL (grpcio) and rustls (the router).
Every certificate is X.509 v3 with the extensions strict verifiers ask for: the CA carries
``basicConstraints CA:TRUE`` and ``keyCertSign``; a leaf carries ``CA:FALSE``, a subject
alternative name per entry of ``sans`` (an IP address or a DNS name) and the extended key usage
``serverAuth``, or ``clientAuth`` when ``client=True``. A missing binary fails loudly.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "openssl is not installed (Debian: apt-get install -y openssl)"

#: Long enough for any test run, short enough that a leaked file is worth nothing.
DAYS = 2

_REQ_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = {usage}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
{alt_names}
"""


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError(INSTALL_HINT)
    done = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "cert"


def _alt_names(sans: Sequence[str]) -> str:
    if not sans:
        return ""
    entries: list[str] = []
    for san in sans:
        try:
            entries.append(f"IP:{ipaddress.ip_address(san)}")
        except ValueError:
            entries.append(f"DNS:{san}")
    return "subjectAltName = " + ", ".join(entries)


def _write_config(
    path: Path, cn: str, *, usage: str = "serverAuth", sans: Sequence[str] = ()
) -> None:
    if any(c in cn for c in "/\n\\="):
        raise ValueError(f"common name {cn!r}: no '/', '=', '\\' or newline")
    path.write_text(_REQ_CONFIG.format(cn=cn, usage=usage, alt_names=_alt_names(sans)))


@dataclass(frozen=True)
class CA:
    """A certificate authority whose certificate (``cert``) and key (``key``) are PEM files in
    ``directory``; :meth:`issue` signs leaves into the same folder."""

    name: str
    directory: Path
    cert: Path
    key: Path

    def issue(
        self,
        common_name: str,
        sans: Sequence[str] = ("127.0.0.1", "localhost"),
        *,
        client: bool = False,
        stem: str | None = None,
    ) -> tuple[Path, Path]:
        """Sign a certificate for ``common_name`` with a SAN per entry of ``sans`` (IP addresses
        and DNS names told apart); ``client=True`` makes it a client certificate (extended key
        usage ``clientAuth`` instead of ``serverAuth``). Returns ``(cert_pem, key_pem)``, written
        as ``<stem>.pem`` / ``<stem>.key`` (default stem: ``<ca>-<common name>[-client]``)."""
        stem = _slug(stem or f"{self.name}-{common_name}{'-client' if client else ''}")
        cert, key = self.directory / f"{stem}.pem", self.directory / f"{stem}.key"
        config, csr = self.directory / f"{stem}.cnf", self.directory / f"{stem}.csr"
        usage = "clientAuth" if client else "serverAuth"
        _write_config(config, common_name, usage=usage, sans=sans)
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-config", str(config),
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
            "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(DAYS), "-sha256",
            "-extfile", str(config), "-extensions", "leaf", "-out", str(cert),
        )  # fmt: skip
        csr.unlink()
        config.unlink()
        return cert, key


def make_ca(name: str, directory: Path | str) -> CA:
    """A new self-signed CA named ``name`` (its common name), written into ``directory`` as
    ``<name>.pem`` and ``<name>.key``. Two calls make two unrelated CAs."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    stem = _slug(name)
    cert, key, config = folder / f"{stem}.pem", folder / f"{stem}.key", folder / f"{stem}.cnf"
    _write_config(config, name)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", str(DAYS), "-sha256",
        "-config", str(config), "-extensions", "ca",
        "-set_serial", f"0x{secrets.token_hex(16)}",
    )  # fmt: skip
    config.unlink()
    return CA(name=name, directory=folder, cert=cert, key=key)


@dataclass(frozen=True)
class MutualTls:
    """What a mutual-TLS test needs: the worker's CA, a server certificate for 127.0.0.1 it
    signed, a client certificate it signed (the router's), and a client certificate of an
    unrelated CA (a stranger's), each ``(cert_pem, key_pem)``."""

    ca: CA
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    stranger: tuple[Path, Path]

    def server_flags(self) -> list[str]:
        """``--ssl-certfile C --ssl-keyfile K --ssl-ca-certs CA``: every launcher's spelling."""
        return [
            "--ssl-certfile", str(self.server[0]), "--ssl-keyfile", str(self.server[1]),
            "--ssl-ca-certs", str(self.ca.cert),
        ]  # fmt: skip

    def router_flags(self) -> list[str]:
        """The router's (``smg launch``) flags to reach such a worker at ``grpcs://``."""
        return [
            "--client-cert-path", str(self.client[0]), "--client-key-path", str(self.client[1]),
            "--ca-cert-paths", str(self.ca.cert),
        ]  # fmt: skip


def mutual_tls(directory: Path | str) -> MutualTls:
    """A fresh :class:`MutualTls` set written into ``directory``."""
    ca = make_ca("worker-ca", directory)
    stranger = make_ca("stranger-ca", directory)
    return MutualTls(
        ca=ca,
        server=ca.issue("127.0.0.1"),
        client=ca.issue("router", client=True),
        stranger=stranger.issue("stranger", client=True),
    )

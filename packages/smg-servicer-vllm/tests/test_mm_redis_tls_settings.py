"""The settings of a ``rediss://`` link to the sidecar's Redis (engine-free): the CA, client
certificate and key files resolve flag > variable > default on both processes, every mistake is a
one-line ``ConfigError`` at start, and the URL's password shows nowhere (its ``repr``, the
settings' line, a config error)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from smg_servicer_core.config import resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.testing.certs import CA, make_ca
from smg_servicer_mm_sidecar.client import RedisTls
from smg_servicer_vllm.mm_settings import (
    MmSettings,
    RedisUrl,
    add_flags,
    redis_tls,
    resolve_mm_settings,
)
from smg_servicer_vllm.mm_sidecar.settings import SETTINGS as SIDECAR
from smg_servicer_vllm.mm_sidecar.settings import TLS_FLAGS

pytestmark = pytest.mark.unit

SECRET = "s3cret-Pa55"
URL = f"rediss://alice:{SECRET}@10.0.0.1:6380/1"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    return make_ca("redis-ca", tmp_path_factory.mktemp("certs"))


def worker_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def sidecar_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for setting in SIDECAR:
        setting.add_to_parser(parser)
    return parser.parse_args(list(argv))


def test_flags_and_variables_give_both_processes_the_same_files(ca: CA) -> None:
    cert, key = ca.issue("worker", client=True)
    env = {
        "SMG_VLLM_MM_REDIS_URL": URL,
        "SMG_VLLM_MM_REDIS_CA_FILE": str(ca.cert),
        "SMG_VLLM_MM_REDIS_CERT_FILE": str(cert),
        "SMG_VLLM_MM_REDIS_KEY_FILE": f" {key} ",
    }
    worker = resolve_mm_settings(None, env)
    sidecar = resolve(SIDECAR, sidecar_args(), env)
    want = RedisTls(str(ca.cert), str(cert), str(key))
    assert worker.tls == want
    assert RedisTls(*(sidecar[f"redis_{k}_file"] for k in ("ca", "cert", "key"))) == want
    assert worker.sources["redis_ca_file"] == sidecar.source("redis_ca_file") == "env"
    # A flag wins; unset is None (the system's CAs, no client certificate).
    other = make_ca("other", ca.directory)
    flagged = resolve_mm_settings(worker_args("--mm-redis-ca-file", str(other.cert)), env)
    assert flagged.redis_ca_file == str(other.cert) and flagged.sources["redis_ca_file"] == "flag"
    side = resolve(SIDECAR, sidecar_args("--redis-ca-file", str(other.cert)), env)
    assert side["redis_ca_file"] == str(other.cert)
    assert resolve_mm_settings(None, {}).tls == RedisTls()


def test_the_password_shows_nowhere(ca: CA) -> None:
    settings = resolve_mm_settings(worker_args("--mm-redis-url", URL), {})
    assert str(settings.redis_url) == URL  # what the client connects with
    assert isinstance(settings.redis_url, RedisUrl)
    for shown in (repr(settings), settings.describe(), repr(settings.redis_url)):
        assert SECRET not in shown and "alice:***@10.0.0.1:6380" in shown
    assert SECRET not in repr(MmSettings(redis_url=URL))  # built directly, too
    # A bad URL's error names it redacted (the message core builds from the value's repr).
    for bad in (f"http://alice:{SECRET}@h/0", f"rediss://alice:{SECRET}@h:port/0"):
        with pytest.raises(ConfigError) as error:
            resolve_mm_settings(worker_args("--mm-redis-url", bad), {})
        assert SECRET not in str(error.value) and "--mm-redis-url" in str(error.value)
    with pytest.raises(ConfigError) as error:
        resolve(SIDECAR, sidecar_args("--redis-url", f"http://alice:{SECRET}@h/0"), {})
    assert SECRET not in str(error.value) and "alice:***@h" in str(error.value)


def test_each_mistake_is_one_line_naming_the_setting(ca: CA, tmp_path: Path) -> None:
    cert, key = ca.issue("worker", client=True)
    _, other_key = ca.issue("another", client=True)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cases = [
        (("--mm-redis-ca-file", str(tmp_path / "missing.pem")), "--mm-redis-ca-file: .*no such"),
        (("--mm-redis-ca-file", str(ca.cert)), "--mm-redis-ca-file: needs a rediss:// URL"),
        (("--mm-redis-url", URL, "--mm-redis-cert-file", str(cert)), "go together"),
        (("--mm-redis-url", URL, "--mm-redis-ca-file", str(junk)), "not a PEM CA certificate"),
        (
            ("--mm-redis-url", URL, "--mm-redis-cert-file", str(cert), "--mm-redis-key-file",
             str(other_key)),
            "not a PEM certificate and its key",
        ),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message) as error:
            resolve_mm_settings(worker_args(*argv), {})
        assert "\n" not in str(error.value) and SECRET not in str(error.value)
    # The sidecar's messages name its own flags.
    with pytest.raises(ConfigError, match="--redis-ca-file: needs a rediss://"):
        redis_tls("redis://h/0", RedisTls(str(ca.cert)), TLS_FLAGS)
    assert redis_tls(URL, RedisTls(str(ca.cert), str(cert), str(key))).ca_file == str(ca.cert)

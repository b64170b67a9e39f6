"""The media address rules (engine-free): which resolved addresses a fetch may reach, how a host
that aiohttp takes as an IP literal is read, and the opt-in's flag and variable on the worker and
the sidecar. The fetches themselves (real sockets, vLLM's connector) are in
``test_media_fetch_ssrf.py``."""

from __future__ import annotations

import argparse
import ipaddress

import pytest

from smg_servicer_core.config import resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_vllm.media_guard import (
    AddressPolicy,
    MediaHostRefused,
    address_rule,
    is_loopback_name,
    literal_address,
)
from smg_servicer_vllm.mm import fetch_error
from smg_servicer_vllm.mm_settings import add_flags, resolve_mm_settings
from smg_servicer_vllm.mm_sidecar.settings import SETTINGS as SIDECAR_SETTINGS

pytestmark = pytest.mark.unit

ENV = "SMG_VLLM_MM_ALLOW_PRIVATE_MEDIA_HOSTS"


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("64:ff9b::7f00:1", "loopback"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("::ffff:169.254.3.3", "link-local"),
        ("169.254.169.254", "cloud metadata"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.1.1.1", "multicast"),
        ("255.255.255.255", "multicast"),
        ("ff02::1", "multicast"),
        ("93.184.216.34", None),
        ("10.0.0.5", None),
        ("192.168.1.1", None),
        ("fd00::2", None),
        ("2606:2800:220:1::1", None),
    ],
)
def test_each_address_gets_its_rule(address: str, rule: str | None) -> None:
    assert address_rule(ipaddress.ip_address(address)) == rule


def test_the_opt_in_lifts_loopback_and_link_local_only() -> None:
    opened = AddressPolicy(allow_private=True)
    for address in ("127.0.0.1", "::1", "169.254.1.1", "fe80::1", "::ffff:127.0.0.1"):
        assert opened.rule(ipaddress.ip_address(address)) is None
    for address, rule in [
        ("169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ]:
        assert opened.rule(ipaddress.ip_address(address)) == rule


def test_one_refused_address_refuses_the_name() -> None:
    with pytest.raises(MediaHostRefused) as info:
        AddressPolicy().check(
            [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("127.0.0.1")]
        )
    assert info.value.rule == "loopback"
    assert info.value.detail == (
        "the URL's host resolves to a loopback address (refused: private media hosts are off; "
        "--mm-allow-private-media-hosts allows them)"
    )


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("169.254.169.254", "169.254.169.254"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("fe80::1%25eth0", "fe80::1"),
        ("example.com", None),
        ("0x7f000001", None),  # not an IP literal to aiohttp: the resolver judges it
    ],
)
def test_an_ip_literal_is_read_as_the_c_library_reads_it(host: str, address: str | None) -> None:
    want = None if address is None else ipaddress.ip_address(address)
    assert literal_address(host) == want


def test_a_broken_literal_is_refused() -> None:
    with pytest.raises(MediaHostRefused, match="is not a valid IP address"):
        literal_address("1.2.3.4.5.6")
    with pytest.raises(MediaHostRefused, match="is not a valid IP address"):
        literal_address("::zz")


@pytest.mark.parametrize(
    "name", ["localhost", "LOCALHOST.", "localhost.localdomain", "a.b.localhost", "ip6-loopback"]
)
def test_loopback_names_are_known_without_a_lookup(name: str) -> None:
    assert is_loopback_name(name)


def test_the_refusal_is_a_client_fault_with_a_client_code() -> None:
    refused = fetch_error(AddressPolicy().refusal("link-local"), "media_refs.items[0]", "image")
    assert refused.code.name == "INVALID_ARGUMENT"
    assert refused.reason == "domain_not_allowed"
    assert refused.message == (
        "media_refs.items[0]: the URL's host resolves to a link-local address (refused: private "
        "media hosts are off; --mm-allow-private-media-hosts allows them)"
    )


def _worker_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_the_worker_opt_in_is_off_by_default_and_a_switch() -> None:
    assert resolve_mm_settings(_worker_flags(), {}).allow_private_media_hosts is False
    on = resolve_mm_settings(_worker_flags("--mm-allow-private-media-hosts"), {ENV: "0"})
    assert (
        on.allow_private_media_hosts is True and on.sources["allow_private_media_hosts"] == "flag"
    )
    by_env = resolve_mm_settings(_worker_flags(), {ENV: "true"})
    assert by_env.allow_private_media_hosts is True
    assert by_env.sources["allow_private_media_hosts"] == "env"
    assert "allow_private_media_hosts=True (env)" in by_env.describe()
    with pytest.raises(ConfigError, match="SMG_VLLM_MM_ALLOW_PRIVATE_MEDIA_HOSTS"):
        resolve_mm_settings(None, {ENV: "maybe"})


def test_the_sidecar_reads_the_same_variable_under_its_own_flag() -> None:
    parser = argparse.ArgumentParser()
    for setting in SIDECAR_SETTINGS:
        setting.add_to_parser(parser)
    assert (
        resolve(SIDECAR_SETTINGS, parser.parse_args([]), {})["allow_private_media_hosts"] is False
    )
    flag = resolve(SIDECAR_SETTINGS, parser.parse_args(["--allow-private-media-hosts"]), {})
    assert flag["allow_private_media_hosts"] is True
    env = resolve(SIDECAR_SETTINGS, parser.parse_args([]), {ENV: "yes"})
    assert (
        env["allow_private_media_hosts"] is True
        and env.source("allow_private_media_hosts") == "env"
    )

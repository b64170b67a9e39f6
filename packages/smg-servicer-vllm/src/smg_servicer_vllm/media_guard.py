"""Media fetching that cannot be pointed at the worker's own machine (SSRF). Engine-free: no vLLM,
no torch; aiohttp (which vLLM brings) does the HTTP.

A media URL's host is refused, with a message naming the rule, when it is or resolves to:

======================  ===========================================  ==========================
rule                    addresses                                    the opt-in allows it
======================  ===========================================  ==========================
``loopback``            127.0.0.0/8, ::1; the names ``localhost``,   yes
                        ``*.localhost``, ``localhost.localdomain``,
                        ``ip6-localhost``, ``ip6-loopback`` (no
                        lookup)
``link-local``          169.254.0.0/16, fe80::/10                    yes
``cloud metadata``      169.254.169.254, fd00:ec2::254 (AWS IPv6),   no
                        100.100.100.200 (Alibaba)
``unspecified``         0.0.0.0/8, ::                                no
``multicast``           224.0.0.0/4, 255.255.255.255, ff00::/8       no
======================  ===========================================  ==========================

IPv4 embedded in IPv6 (``::ffff:a.b.c.d``, NAT64 ``64:ff9b::a.b.c.d``, ``::a.b.c.d``) is judged
as the IPv4 address. Private networks (10/8, 172.16/12, 192.168/16, fc00::/7 apart from the
metadata address, 100.64/10 apart from the metadata address) are not refused: internal object
stores live there; ``--allowed-media-domains`` restricts hosts further. The opt-in
(``--mm-allow-private-media-hosts``) is for local media servers such as the tests'.

How the check cannot be bypassed:

- **resolved, not spelled**: names go through :class:`GuardedResolver`, the connector's only
  resolver, which refuses the whole name when any address it resolves to is refused (so
  ``2130706433``, ``0x7f000001``, ``0177.0.0.1`` and ``127.1`` -- which the C library turns into
  127.0.0.1 -- and a DNS name pointing at 169.254.169.254 are all refused); aiohttp skips the
  resolver for what it takes as an IP literal, so :meth:`GuardedFetcher.check_host` judges those
  (numeric IPv4 forms read as the C library reads them);
- **no rebinding**: the addresses the resolver checked are the ones aiohttp connects to (the
  resolver's answer is the connection's address list; the DNS cache is off, so every new
  connection resolves and checks again);
- **every redirect**: redirects are followed here, one hop at a time (at most
  :data:`MAX_REDIRECTS`), each hop's URL checked again (scheme, ``--allowed-media-domains`` --
  which vLLM itself checks on the first URL only -- and its host as above);
  ``VLLM_MEDIA_URL_ALLOW_REDIRECTS=0`` returns the redirect response itself, as vLLM does;
- **no proxy**: the session ignores ``HTTP(S)_PROXY`` (a proxy would resolve the host itself,
  past the check).

A refusal is :class:`MediaHostRefused` (not an ``OSError`` or ``ValueError``, so neither vLLM's
retry nor its error wrapping touch it); its ``detail`` is client-safe text.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The most redirects one fetch follows (aiohttp's own default).
MAX_REDIRECTS = 10
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Cloud metadata endpoints, refused whatever the opt-in says.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
#: Names that mean this machine (RFC 6761 and the usual /etc/hosts), refused without a lookup.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
OPT_IN_FLAG = "--mm-allow-private-media-hosts"
#: Rules the opt-in lifts; the others hold always.
PRIVATE_RULES = frozenset({"loopback", "link-local"})

_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_BROADCAST = ipaddress.ip_address("255.255.255.255")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")


class MediaHostRefused(Exception):
    """A media URL this worker will not fetch. ``detail`` is client-safe (no resolved address, no
    allow-list); ``rule`` names the address rule, or is None for a non-address refusal."""

    def __init__(self, detail: str, rule: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.rule = rule


def _embedded_v4(address: Address) -> Address:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, compatible), else itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64 or (address in _COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def address_rule(address: Address) -> str | None:
    """The rule that refuses ``address`` when private hosts are off, or None."""
    address = _embedded_v4(address)
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    if address.is_unspecified or address in _THIS_NETWORK:
        return "unspecified"
    if address.is_multicast or address == _BROADCAST:
        return "multicast"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    return None


def is_loopback_name(host: str) -> bool:
    name = host.rstrip(".").lower()
    return name in LOOPBACK_NAMES or name.endswith(".localhost")


@dataclass(frozen=True)
class AddressPolicy:
    """Which resolved addresses a fetch may connect to. ``allow_private`` is the opt-in;
    ``opt_in`` names it in messages (the worker's flag, or the sidecar's)."""

    allow_private: bool = False
    opt_in: str = OPT_IN_FLAG

    def rule(self, address: Address) -> str | None:
        """The rule that refuses ``address`` under this policy, or None."""
        rule = address_rule(address)
        if rule in PRIVATE_RULES and self.allow_private:
            return None
        return rule

    def refusal(self, rule: str, subject: str = "the URL's host") -> MediaHostRefused:
        why = (
            f"refused: private media hosts are off; {self.opt_in} allows them"
            if rule in PRIVATE_RULES
            else "refused always"
        )
        article = "an" if rule[0] in "aeiou" else "a"
        return MediaHostRefused(f"{subject} resolves to {article} {rule} address ({why})", rule)

    def check(self, addresses: Iterable[Address], subject: str = "the URL's host") -> None:
        """Refuse when any of ``addresses`` is refused (one bad answer refuses the name)."""
        for address in addresses:
            rule = self.rule(address)
            if rule is not None:
                raise self.refusal(rule, subject)


def literal_address(host: str, subject: str = "the URL's host") -> Address | None:
    """The address an IP-literal host connects to, read as the C library reads it (``127.1``,
    ``2130706433`` and ``0177.0.0.1`` are 127.0.0.1); None for a name. Raises
    :class:`MediaHostRefused` for something aiohttp would take as an address but is not one."""
    try:
        if ":" in host:
            return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
        if host.rstrip(".").replace(".", "").isdigit():
            return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
    except (ValueError, OSError):
        raise MediaHostRefused(f"{subject} is not a valid IP address") from None
    return None


class GuardedResolver(AbstractResolver):
    """The connector's resolver: ``inner``'s answer (aiohttp's threaded ``getaddrinfo`` by
    default; a test may give its own), refused whole when any address breaks ``policy``."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner

    def _resolver(self) -> AbstractResolver:
        if self.inner is None:
            self.inner = aiohttp.ThreadedResolver()
        return self.inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if is_loopback_name(host):
            self.policy.check([ipaddress.ip_address("127.0.0.1")])
        results = await self._resolver().resolve(host, port, family)
        self.policy.check(ipaddress.ip_address(str(r["host"]).split("%", 1)[0]) for r in results)
        return results

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


def _subjects(hop: int) -> tuple[str, str]:
    """How messages name hop ``hop``'s URL and host."""
    return (
        ("the URL", "the URL's host")
        if hop == 0
        else (f"redirect {hop}'s URL", f"redirect {hop}'s host")
    )


class GuardedFetcher:
    """GETs under an :class:`AddressPolicy`, redirects followed and checked hop by hop.

    ``allowed_domains``: vLLM's ``--allowed-media-domains`` (empty: any host), applied to every
    hop. ``resolver``: the inner resolver of :class:`GuardedResolver` (tests only). The session
    is made on first use, in the running loop."""

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        allowed_domains: Iterable[str] = (),
        resolver: AbstractResolver | None = None,
        max_redirects: int = MAX_REDIRECTS,
    ) -> None:
        self.policy = policy
        self.allowed_domains = frozenset(allowed_domains)
        self.resolver = resolver
        self.max_redirects = max_redirects
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self.policy, self.resolver), use_dns_cache=False
            )
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def check_url(self, url: URL, hop: int) -> None:
        """The checks made before hop ``hop`` connects: scheme, domains, an IP-literal host."""
        url_subject, host_subject = _subjects(hop)
        if url.scheme not in ("http", "https"):
            raise MediaHostRefused(f"{url_subject} is not an http or https URL")
        host = url.raw_host or ""
        if not host:
            raise MediaHostRefused(f"{url_subject} has no host")
        if self.allowed_domains and url.host not in self.allowed_domains:
            raise MediaHostRefused(f"{host_subject} is not in --allowed-media-domains")
        literal = literal_address(host, host_subject)
        if literal is not None:
            self.policy.check([literal], host_subject)

    async def _send(self, url: URL, hop: int, headers: Any, deadline: float | None) -> Any:
        self.check_url(url, hop)
        kwargs: dict[str, Any] = {"headers": headers, "allow_redirects": False}
        if deadline is not None:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError
            kwargs["timeout"] = aiohttp.ClientTimeout(total=remaining)
        try:
            return await self.session().get(url, **kwargs)
        except MediaHostRefused as exc:
            if hop == 0 or exc.rule is None:
                raise
            raise self.policy.refusal(exc.rule, _subjects(hop)[1]) from None

    @contextlib.asynccontextmanager
    async def get(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - vLLM's HTTPConnection signature
        allow_redirects: bool = True,
    ) -> AsyncGenerator[aiohttp.ClientResponse]:
        """The final response of a GET (``async with``). ``timeout`` (seconds) bounds the whole
        chain of hops, the final body's read included (aiohttp's total timeout)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        current = URL(url)
        for hop in range(self.max_redirects + 1):
            response = await self._send(current, hop, headers, deadline)
            location = response.headers.get("Location")
            if not allow_redirects or response.status not in REDIRECT_STATUSES or not location:
                try:
                    yield response
                finally:
                    response.release()
                return
            response.release()
            try:
                current = current.join(URL(location))
            except ValueError:
                raise MediaHostRefused(f"redirect {hop + 1}'s URL is not valid") from None
        raise MediaHostRefused(f"more than {self.max_redirects} redirects")

"""SSRF: crafted media URLs through the real fetch path -- the worker's ``InprocessProcessor``
(vLLM's media connector over our guarded connection, then ``fetch_error``) and the sidecar's job
processor -- are each refused with the rule that applies and without any connection to the
target: a real listening socket on 127.0.0.1 (and ::1) records every connection it accepts and
must record none. Needs vLLM's connector (no model, no engine process).

The redirect cases need a first hop the production rules allow: a server on 127.0.0.2 reached
as ``media.example`` through an injected name table (the fetcher's inner resolver), under a
policy that exempts exactly 127.0.0.2. Everything else -- the resolver's check, the IP-literal
check, the hop-by-hop redirect loop, vLLM's connector, the error mapping -- is the production
code."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import ThreadedResolver
from aiohttp.abc import AbstractResolver, ResolveResult

from smg_servicer_core.testing.media import png_image
from smg_servicer_mm_sidecar import protocol as p
from smg_servicer_vllm.media_guard import AddressPolicy, GuardedFetcher, MediaHostRefused
from smg_servicer_vllm.mm import MediaItem, MediaRefused, MediaUnavailable
from smg_servicer_vllm.mm_settings import MmSettings

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="module")]

PNG = png_image(8, 8, seed=3)
OPT_IN = "--mm-allow-private-media-hosts allows them"
ALWAYS = "refused always"
#: The exempted first hop of the redirect cases (127.0.0.2 is loopback too: Linux routes 127/8).
HOP = "127.0.0.2"


@dataclass
class Recorder:
    """Listening sockets on 127.0.0.1 and ::1 (one port) that record each accepted connection
    and answer it with a PNG."""

    port: int = 0
    accepted: list[tuple[str, int]] = field(default_factory=list[tuple[str, int]])
    sockets: list[socket.socket] = field(default_factory=list[socket.socket])

    def start(self) -> Recorder:
        v4 = socket.create_server(("127.0.0.1", 0))
        self.port = v4.getsockname()[1]
        self.sockets.append(v4)
        with contextlib.suppress(OSError):  # no IPv6 loopback: [::1] is refused before connecting
            self.sockets.append(socket.create_server(("::1", self.port), family=socket.AF_INET6))
        for listener in self.sockets:
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            self.accepted.append((peer[0], peer[1]))
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    head = (
                        f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {len(PNG)}"
                    )
                    conn.sendall(head.encode() + b"\r\nConnection: close\r\n\r\n" + PNG)
                except OSError:
                    pass

    def close(self) -> None:
        for listener in self.sockets:
            listener.close()


@pytest.fixture(scope="module")
def listening() -> Iterator[Recorder]:
    rec = Recorder().start()
    yield rec
    rec.close()


@pytest.fixture
def recorder(listening: Recorder) -> Recorder:
    """The module's recorder, its record emptied for this test."""
    listening.accepted.clear()
    return listening


class Redirects:
    """An HTTP server on 127.0.0.2 whose ``/to/<name>`` answers 302 to ``targets[name]``;
    ``/a.png`` is an image."""

    def __init__(self, targets: dict[str, str]) -> None:
        self.targets = targets
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                name = self.path.removeprefix("/to/")
                if self.path == "/a.png":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(PNG)))
                    self.end_headers()
                    self.wfile.write(PNG)
                    return
                self.send_response(302 if name in outer.targets else 404)
                if name in outer.targets:
                    self.send_header("Location", outer.targets[name])
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer((HOP, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://media.example:{self.port}{path}"


@pytest.fixture(scope="module")
def redirects(listening: Recorder) -> Iterator[Redirects]:
    # Binds HOP (127.0.0.2, any 127/8 address on Linux): where it cannot, the server's start
    # fails here, loudly.
    port = listening.port
    server = Redirects(
        {
            "metadata": "http://169.254.169.254/latest/meta-data/",
            "metadata-v6": "http://[fd00:ec2::254]/latest/meta-data/",
            "loopback": f"http://127.0.0.1:{port}/a.png",
            "decimal": f"http://2130706433:{port}/a.png",
            "localhost": f"http://localhost:{port}/a.png",
            "name": f"http://loopback.example:{port}/a.png",
            "mapped": f"http://[::ffff:127.0.0.1]:{port}/a.png",
            "file": "file:///etc/passwd",
            "other-domain": "http://other.example/a.png",
            "loop": "/to/loop",
            "ok": "/a.png",
        }
    )
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


class NameTable(AbstractResolver):
    """Test names (``media.example`` -> 127.0.0.2, ``loopback.example`` -> 127.0.0.1, ...); any
    other name goes to the real ``getaddrinfo``."""

    NAMES = {
        "media.example": HOP,
        "other.example": HOP,
        "loopback.example": "127.0.0.1",
        "metadata.example": "169.254.169.254",
        "mixed.example": ("93.184.216.34", "127.0.0.1"),
    }

    def __init__(self) -> None:
        self.real = ThreadedResolver()
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        addresses = self.NAMES.get(host.rstrip(".").lower())
        if addresses is None:
            return await self.real.resolve(host, port, family)
        listed = (addresses,) if isinstance(addresses, str) else addresses
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in listed
        ]

    async def close(self) -> None:
        await self.real.close()


@dataclass(frozen=True)
class ExemptHop(AddressPolicy):
    """The production rules, except that 127.0.0.2 (the redirect server) may be reached."""

    def rule(self, address: Any) -> str | None:
        return None if address == ipaddress.ip_address(HOP) else super().rule(address)


def processor(
    settings: MmSettings | None = None,
    *,
    fetcher: GuardedFetcher | None = None,
    domains: list[str] | None = None,
) -> Any:
    from smg_servicer_vllm._mm_engine import InprocessProcessor

    model_config = SimpleNamespace(
        multimodal_config=None, allowed_local_media_path="", allowed_media_domains=domains
    )
    engine = SimpleNamespace(model_config=model_config, renderer=None)
    return InprocessProcessor(
        engine, settings or MmSettings(processor="inprocess"), fetcher=fetcher
    )


async def refusal(proc: Any, url: str) -> MediaRefused:
    with pytest.raises(MediaRefused) as info:
        await asyncio.wait_for(proc.fetch([MediaItem("image", url)]), 20)
    return info.value


#: (id, URL with ``{port}`` for the recorder's port, the rule in the message, why).
CRAFTED = [
    ("dotted", "http://127.0.0.1:{port}/a.png", "loopback", OPT_IN),
    ("decimal", "http://2130706433:{port}/a.png", "loopback", OPT_IN),
    ("hex", "http://0x7f000001:{port}/a.png", "loopback", OPT_IN),
    ("hex-short", "http://0x7f.1:{port}/a.png", "loopback", OPT_IN),
    ("octal", "http://0177.0.0.1:{port}/a.png", "loopback", OPT_IN),
    ("octal-one-number", "http://017700000001:{port}/a.png", "loopback", OPT_IN),
    ("short", "http://127.1:{port}/a.png", "loopback", OPT_IN),
    ("short-3", "http://127.0.1:{port}/a.png", "loopback", OPT_IN),
    ("v6-loopback", "http://[::1]:{port}/a.png", "loopback", OPT_IN),
    ("v4-mapped", "http://[::ffff:127.0.0.1]:{port}/a.png", "loopback", OPT_IN),
    ("v4-mapped-hex", "http://[::ffff:7f00:1]:{port}/a.png", "loopback", OPT_IN),
    ("nat64", "http://[64:ff9b::127.0.0.1]:{port}/a.png", "loopback", OPT_IN),
    ("localhost", "http://localhost:{port}/a.png", "loopback", OPT_IN),
    ("LOCALHOST-dot", "http://LOCALHOST.:{port}/a.png", "loopback", OPT_IN),
    ("localhost.localdomain", "http://localhost.localdomain:{port}/a.png", "loopback", OPT_IN),
    ("x.localhost", "http://media.localhost:{port}/a.png", "loopback", OPT_IN),
    ("name-to-loopback", "http://loopback.example:{port}/a.png", "loopback", OPT_IN),
    ("name-one-of-two", "http://mixed.example:{port}/a.png", "loopback", OPT_IN),
    ("zeros", "http://0.0.0.0:{port}/a.png", "unspecified", ALWAYS),
    ("zero", "http://0:{port}/a.png", "unspecified", ALWAYS),
    ("v6-unspecified", "http://[::]:{port}/a.png", "unspecified", ALWAYS),
    ("metadata", "http://169.254.169.254/latest/meta-data/", "cloud metadata", ALWAYS),
    ("name-to-metadata", "http://metadata.example/latest/meta-data/", "cloud metadata", ALWAYS),
    ("metadata-v6", "http://[fd00:ec2::254]/latest/meta-data/", "cloud metadata", ALWAYS),
    ("metadata-mapped", "http://[::ffff:169.254.169.254]/", "cloud metadata", ALWAYS),
    ("link-local", "http://169.254.10.10/", "link-local", OPT_IN),
    ("link-local-v6-zone", "http://[fe80::1%25lo]/", "link-local", OPT_IN),
    ("multicast", "http://224.0.0.1/", "multicast", ALWAYS),
    ("multicast-v6", "http://[ff02::1]/", "multicast", ALWAYS),
]


@pytest.mark.parametrize(
    ("url", "rule", "why"), [pytest.param(*case[1:], id=case[0]) for case in CRAFTED]
)
async def test_a_crafted_url_is_refused_by_its_rule_without_a_connection(
    recorder: Recorder, url: str, rule: str, why: str
) -> None:
    proc = processor(fetcher=GuardedFetcher(AddressPolicy(), resolver=NameTable()))
    try:
        refused = await refusal(proc, url.format(port=recorder.port))
    finally:
        await proc.aclose()
    assert refused.reason == "domain_not_allowed"
    article = "an" if rule[0] in "aeiou" else "a"
    assert refused.message.startswith(
        f"media_refs.items[0]: the URL's host resolves to {article} {rule} address ("
    ), refused.message
    assert why in refused.message
    assert recorder.accepted == []


async def test_the_default_processor_refuses_and_the_opt_in_fetches(recorder: Recorder) -> None:
    """The processor's own fetcher, built from the settings: refused by default; with the
    opt-in the same URL is fetched (the recorder sees it: it would have seen the others)."""
    url = f"http://127.0.0.1:{recorder.port}/a.png"
    strict = processor()
    refused = await refusal(strict, url)
    await strict.aclose()
    assert "loopback address" in refused.message and OPT_IN in refused.message
    assert recorder.accepted == []
    opened = processor(MmSettings(processor="inprocess", allow_private_media_hosts=True))
    try:
        data = await asyncio.wait_for(opened.fetch([MediaItem("image", url)]), 20)
    finally:
        await opened.aclose()
    assert data["image"][0].size == (8, 8)
    assert len(recorder.accepted) == 1


REDIRECTS = {
    "metadata": ("redirect 1's host resolves to a cloud metadata address", ALWAYS),
    "metadata-v6": ("redirect 1's host resolves to a cloud metadata address", ALWAYS),
    "loopback": ("redirect 1's host resolves to a loopback address", OPT_IN),
    "decimal": ("redirect 1's host resolves to a loopback address", OPT_IN),
    "localhost": ("redirect 1's host resolves to a loopback address", OPT_IN),
    "name": ("redirect 1's host resolves to a loopback address", OPT_IN),
    "mapped": ("redirect 1's host resolves to a loopback address", OPT_IN),
    "file": ("redirect 1's URL is not an http or https URL", ""),
    "loop": ("more than 10 redirects", ""),
}


@pytest.mark.parametrize("name", list(REDIRECTS))
async def test_a_redirect_is_checked_again_without_a_connection(
    recorder: Recorder, redirects: Redirects, name: str
) -> None:
    names = NameTable()
    proc = processor(fetcher=GuardedFetcher(ExemptHop(), resolver=names))
    try:
        refused = await refusal(proc, redirects.url(f"/to/{name}"))
    finally:
        await proc.aclose()
    message, why = REDIRECTS[name]
    assert refused.reason == "domain_not_allowed"
    assert refused.message.startswith(f"media_refs.items[0]: {message}"), refused.message
    assert why in refused.message
    assert f"/to/{name}" in redirects.paths  # the first hop was served
    assert recorder.accepted == []


async def test_an_allowed_redirect_is_followed(redirects: Redirects) -> None:
    proc = processor(fetcher=GuardedFetcher(ExemptHop(), resolver=NameTable()))
    try:
        data = await asyncio.wait_for(proc.fetch([MediaItem("image", redirects.url("/to/ok"))]), 20)
    finally:
        await proc.aclose()
    assert data["image"][0].size == (8, 8)


async def test_allowed_media_domains_hold_on_every_hop(
    recorder: Recorder, redirects: Redirects
) -> None:
    fetcher = GuardedFetcher(ExemptHop(), allowed_domains=["media.example"], resolver=NameTable())
    proc = processor(fetcher=fetcher, domains=["media.example"])
    try:
        refused = await refusal(proc, redirects.url("/to/other-domain"))
        first = await refusal(proc, "http://other.example/a.png")  # vLLM's own check
    finally:
        await proc.aclose()
    assert refused.message == (
        "media_refs.items[0]: redirect 1's host is not in --allowed-media-domains"
    )
    assert first.message == "media_refs.items[0]: the URL's host is not in --allowed-media-domains"
    assert refused.reason == first.reason == "domain_not_allowed"
    assert recorder.accepted == []


async def test_without_redirects_the_redirect_is_the_answer(redirects: Redirects) -> None:
    """``VLLM_MEDIA_URL_ALLOW_REDIRECTS=0`` (vLLM passes ``allow_redirects=False``): the 302
    itself comes back, nothing is followed."""
    fetcher = GuardedFetcher(ExemptHop(), resolver=NameTable())
    try:
        async with fetcher.get(redirects.url("/to/metadata"), allow_redirects=False) as response:
            assert response.status == 302
        with pytest.raises(MediaHostRefused, match="redirect 1's host resolves to a cloud"):
            async with fetcher.get(redirects.url("/to/metadata"), timeout=10):
                pass
    finally:
        await fetcher.aclose()


async def test_the_sidecar_refuses_with_a_client_code(recorder: Recorder) -> None:
    from smg_servicer_vllm.mm_sidecar.jobs import VllmJobProcessor

    mm = SimpleNamespace(
        limit_per_prompt={},
        language_model_only=False,
        media_io_kwargs=None,
        mm_processor_kwargs=None,
    )
    model_config = SimpleNamespace(
        model="tiny",
        dtype="float32",
        multimodal_config=mm,
        allowed_local_media_path="",
        allowed_media_domains=None,
    )
    job_processor = VllmJobProcessor(SimpleNamespace(model_config=model_config), None)
    port = recorder.port
    try:
        for url, rule in [
            (f"http://127.0.0.1:{port}/a.png", "loopback"),
            (f"http://0x7f000001:{port}/a.png", "loopback"),
            ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ]:
            job = p.Job(
                v=p.SCHEMA,
                job_id="j1",
                request_id="r1",
                fingerprint=job_processor.fingerprint,
                prompt_token_ids=[1, 2],
                prompt=None,
                items=[p.JobItem("image", url)],
                enqueued_ms=0,
                deadline_ms=0,
            )
            result = await asyncio.wait_for(job_processor.process(job), 20)
            assert not result.ok and result.code == "domain_not_allowed", result
            assert p.status_for(result.code) == "INVALID_ARGUMENT"
            assert f"resolves to a {rule} address" in result.message
            if rule == "loopback":
                assert "--allow-private-media-hosts allows them" in result.message
    finally:
        await job_processor.inner.aclose()
    assert recorder.accepted == []


async def test_a_fetch_failure_is_still_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard changes nothing for a public-looking host that cannot be reached."""
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    proc = processor(fetcher=GuardedFetcher(AddressPolicy(), resolver=NameTable()))
    try:
        with pytest.raises(MediaUnavailable):
            await asyncio.wait_for(
                proc.fetch([MediaItem("image", "http://no-such-host.invalid/a.png")]), 60
            )
    finally:
        await proc.aclose()

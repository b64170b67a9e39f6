"""A TLS-originating sidecar for the router: plain text in on 127.0.0.1, mutual TLS out.

The router (``smg`` 1.13.0) cannot reach a gRPC worker over TLS: its worker channel is built
without a TLS configuration (given ``grpcs://`` and its client certificate it never connects,
"gRPC connection failed: transport error": ``test_the_routers_own_tls_flags_do_not_reach_a_grpc_
worker``; ``--client-cert-path``/``--ca-cert-paths`` apply to HTTP workers only). Deployments
that lock the worker's port put a TLS-originating sidecar (stunnel, Envoy) next to the router;
:class:`TlsOriginator` is that sidecar for tests: each accepted connection is forwarded to the
worker over TLS with the router's client certificate, ALPN ``h2``, the worker's certificate
verified against its CA.

    with TlsOriginator(("127.0.0.1", worker.port), pki) as proxy, Router(proxy.url) as router:
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from types import TracebackType
from typing import Self

from smg_servicer_core.testing.certs import MutualTls

CHUNK = 64 * 1024
START_TIMEOUT_S = 10.0


class TlsOriginator:
    def __init__(self, target: tuple[str, int], pki: MutualTls) -> None:
        self.target = target
        self.context = ssl.create_default_context(cafile=str(pki.ca.cert))
        self.context.load_cert_chain(str(pki.client[0]), str(pki.client[1]))
        self.context.set_alpn_protocols(["h2"])
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        host, port = self.target
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.context, server_hostname=host),
                START_TIMEOUT_S,
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def __enter__(self) -> Self:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.port = future.result(START_TIMEOUT_S)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)

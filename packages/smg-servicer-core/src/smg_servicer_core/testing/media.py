"""Media for multimodal tests, without PIL: deterministic PNG images, ``data:`` URLs, and a local
HTTP server that serves them (optionally slowly, or with an error status).

- :func:`png_image` — an RGB PNG of noise from a seed (stdlib ``zlib``; any size);
- :func:`data_url` — ``data:image/png;base64,...``;
- :class:`MediaServer` — ``with MediaServer() as server: server.url("/a.png")``: serves what
  :meth:`MediaServer.put` registered on 127.0.0.1, a route may wait before answering (``delay_s``)
  or answer a status without a body (``status``). A waiting route holds its request until the
  delay passes or the server closes.
"""

from __future__ import annotations

import base64
import random
import struct
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


def png_image(
    width: int = 40, height: int = 50, seed: int = 0, color: tuple[int, int, int] | None = None
) -> bytes:
    """An 8-bit RGB PNG of pseudo-random pixels (the same bytes for the same arguments), or of
    one ``color``."""
    rng = random.Random(seed)
    if color is None:
        rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))
    else:
        rows = (b"\x00" + bytes(color) * width) * height

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def data_url(content: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(content).decode('ascii')}"


@dataclass(frozen=True)
class _Route:
    body: bytes
    status: int = 200
    delay_s: float = 0.0
    mime: str = "image/png"


class MediaServer:
    """A threaded HTTP server on 127.0.0.1 (a free port) for the routes :meth:`put` registers."""

    def __init__(self) -> None:
        self.routes: dict[str, _Route] = {}
        self.hits: dict[str, threading.Event] = {}
        self.closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = server.routes.get(self.path)
                server.hit(self.path).set()
                if route is None:
                    self.send_error(404)
                    return
                if route.delay_s:
                    server.closing.wait(route.delay_s)
                self.send_response(route.status)
                self.send_header("Content-Type", route.mime)
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                self.wfile.write(route.body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def hit(self, path: str) -> threading.Event:
        """Set once ``path`` has been requested."""
        return self.hits.setdefault(path, threading.Event())

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def put(
        self,
        path: str,
        body: bytes = b"",
        *,
        status: int = 200,
        delay_s: float = 0.0,
        mime: str = "image/png",
    ) -> str:
        self.routes[path] = _Route(body, status, delay_s, mime)
        return self.url(path)

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

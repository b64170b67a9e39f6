""":mod:`smg_it.wheel_fetch` and :mod:`smg_it.wheel_sources` (the conformance tests' wheel
reader), without the network: a wheel built here, served by a loopback index that answers Range
requests (contract), and the ``ast`` questions on a cache folder written by hand (unit)."""

from __future__ import annotations

import http.server
import inspect
import io
import json
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from smg_it import wheel_fetch, wheel_sources
from smg_it.wheel_sources import (
    CLASS,
    EXTERNAL,
    FUNCTION,
    MODULE,
    VALUE,
    SourceTree,
    WheelSources,
    WheelUnavailable,
    binding_problems,
    is_property,
)

PACKAGE = {
    "pkg/__init__.py": """
import typing
from .version import __version__
from .sub import *
MODULE_ATTRS = {"Lazy": ".deep.inner:Lazy"}
if typing.TYPE_CHECKING:
    from .deep.inner import Hidden
else:
    def __getattr__(name):
        if name in MODULE_ATTRS:
            return 1
        raise AttributeError(name)
""",
    "pkg/version.py": "__version__ = '1.0'\n",
    "pkg/envs.py": """
environment_variables = {"PKG_FLAG": lambda: 1}
def __getattr__(name):
    if name in environment_variables:
        return environment_variables[name]()
""",
    "pkg/sub.py": """
import argparse
from dataclasses import dataclass
__all__ = ["Child", "REGISTRY"]
class Base:
    def __init__(self, a, *, flag=False):
        self.seen = a
    def method(self, x, y=1):
        pass
    @property
    def value(self):
        return 1
class Child(Base):
    def __init__(self, *args, extra=None, **kwargs):
        super().__init__(*args, **kwargs)
@dataclass
class Fields:
    one: int
    two: str = ""
class Parser(argparse.ArgumentParser):
    pass
class Registry:
    def create(self, config, *, cache=None):
        pass
REGISTRY = Registry()
_private = 1
""",
    "pkg/deep/__init__.py": "",
    "pkg/deep/inner.py": "class Lazy:\n    pass\nclass Hidden:\n    pass\n",
    "pkg-1.0.dist-info/entry_points.txt": "[console_scripts]\npkg = pkg.cli:main\n",
}


def wheel_bytes(filler: int = 2_000_000) -> bytes:
    """The package plus a large member that a reader must never fetch."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in PACKAGE.items():
            archive.writestr(name, text)
        archive.writestr("pkg/_big.so", os.urandom(filler), zipfile.ZIP_STORED)
    return buffer.getvalue()


class Index(http.server.ThreadingHTTPServer):
    """A PEP 691 index of one wheel that answers Range requests (``ranges=False``: it ignores
    them); it counts the bytes it sends."""

    def __init__(self, wheel: bytes, *, ranges: bool = True) -> None:
        self.wheel, self.ranges, self.sent, self.requests = wheel, ranges, 0, 0
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def do_GET(self) -> None:
        index = cast(Index, self.server)
        index.requests += 1
        if self.path == "/simple/pkg/":
            body = json.dumps(
                {
                    "files": [
                        {
                            "filename": f"pkg-1.0-{build}cp38-abi3-manylinux_2_28_x86_64.whl",
                            "url": f"{index.url}/files/pkg.whl",
                            "size": len(index.wheel),
                            "yanked": False,
                        }
                        for build in ("", "1-")
                    ]
                    + [{"filename": "pkg-1.0-py3-none-any.whl", "url": "x", "size": 1}]
                }
            ).encode()
            self._send(200, body)
            return
        header = self.headers.get("Range", "")
        if not index.ranges or not header.startswith("bytes="):
            self._send(200, index.wheel)
            return
        start, end = (int(n) for n in header.removeprefix("bytes=").split("-"))
        self._send(206, index.wheel[start : end + 1])

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        cast(Index, self.server).sent += len(body)


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    server = Index(wheel_bytes())
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setattr(wheel_fetch, "INDEX_URL", f"{server.url}/simple/{{project}}/")
    monkeypatch.setattr(wheel_fetch, "BACKOFF_S", 0.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.contract
def test_members_are_read_over_ranges_then_from_the_cache_alone(
    index: Index, tmp_path: Path
) -> None:
    sources = WheelSources("pkg", "1.0", tmp_path)
    assert sources.wheel().filename == "pkg-1.0-1-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert sources.read("pkg/sub.py") == PACKAGE["pkg/sub.py"]
    assert sources.read("pkg/missing.py") is None
    assert "pkg/_big.so" in sources.names()
    assert sources.fetched == 1
    assert index.sent < len(index.wheel) // 4  # the central directory and one member
    sources.close()
    index.shutdown()  # nothing answers now: what was read is cached
    again = WheelSources("pkg", "1.0", tmp_path)
    assert again.read("pkg/sub.py") == PACKAGE["pkg/sub.py"]
    assert again.names() == sources.names()
    assert again.fetched == 0
    assert again.requests == 0
    cached = sorted(p.name for p in (tmp_path / "pkg-1.0").iterdir())
    assert cached == ["files", "names.txt", "wheel.json"]


@pytest.mark.contract
def test_an_uncached_member_with_the_index_gone_fails_and_says_why(
    index: Index, tmp_path: Path
) -> None:
    WheelSources("pkg", "1.0", tmp_path).names()
    index.shutdown()
    index.server_close()
    with pytest.raises(WheelUnavailable, match=r"pkg 1\.0 .*not read in 3 attempts"):
        WheelSources("pkg", "1.0", tmp_path).read("pkg/version.py")


@pytest.mark.contract
def test_a_server_that_ignores_the_range_is_refused(index: Index, tmp_path: Path) -> None:
    index.ranges = False
    with pytest.raises(WheelUnavailable, match="answered 200 to a Range request"):
        WheelSources("pkg", "1.0", tmp_path).names()


@pytest.mark.contract
def test_a_release_the_index_lacks_is_named(index: Index, tmp_path: Path) -> None:
    with pytest.raises(WheelUnavailable, match=r"has no 2\.0 wheel"):
        WheelSources("pkg", "2.0", tmp_path).names()


@pytest.fixture
def tree(tmp_path: Path) -> SourceTree:
    """The package as a cache folder (what a first run leaves): no index needed."""
    folder = tmp_path / "pkg-1.0"
    (folder / "names.txt").parent.mkdir(parents=True)
    (folder / "names.txt").write_text("\n".join(PACKAGE))
    for name, text in PACKAGE.items():
        (folder / "files" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "files" / name).write_text(text)
    return SourceTree(WheelSources("pkg", "1.0", tmp_path))


@pytest.mark.unit
def test_names_resolve_through_re_exports_and_lazy_tables(tree: SourceTree) -> None:
    assert tree.has_module("pkg.deep") and not tree.has_module("pkg.nope")
    assert tree.resolve("pkg.__version__") == wheel_sources.Symbol(
        VALUE, "pkg.version", "__version__"
    )
    lazy = tree.resolve("pkg.Lazy")  # MODULE_ATTRS, followed
    assert lazy is not None and (lazy.kind, lazy.where) == (CLASS, "pkg.deep.inner.Lazy")
    assert tree.resolve("pkg.Hidden") is None  # imported under TYPE_CHECKING only
    child = tree.resolve("pkg.Child")  # from .sub import * (in __all__)
    assert child is not None and child.where == "pkg.sub.Child"
    assert tree.resolve("pkg._private") is None  # not in __all__
    flag = tree.resolve("pkg.envs.PKG_FLAG")  # a __getattr__ table of values
    assert flag is not None and flag.kind == VALUE
    assert tree.resolve("pkg.deep").kind == MODULE  # type: ignore[union-attr]
    assert tree.resolve("pkg.sub.argparse") == wheel_sources.Symbol(EXTERNAL, "argparse")


@pytest.mark.unit
def test_members_come_from_the_class_its_methods_and_its_bases(tree: SourceTree) -> None:
    child = tree.resolve("pkg.sub.Child")
    assert child is not None
    method = tree.member(child, "method")
    assert method is not None and (method.kind, method.where) == (FUNCTION, "pkg.sub.Base.method")
    assert str(tree.signature(method)) == "(x, y=...)"
    seen = tree.member(child, "seen")  # self.seen = a
    assert seen is not None and seen.kind == VALUE
    value = tree.member(child, "value")
    assert value is not None and is_property(value) and not is_property(method)
    assert tree.member(child, "absent") is None
    parser = tree.resolve("pkg.sub.Parser")
    assert parser is not None
    parse = tree.member(parser, "parse_known_args")  # the standard library's, by import
    assert parse is not None and parse.kind == EXTERNAL
    assert list(tree.signature(parse).parameters) == ["args", "namespace"]
    create = tree.resolve("pkg.sub.REGISTRY.create")  # a module-level instance's method
    assert create is not None and create.where == "pkg.sub.Registry.create"


@pytest.mark.unit
def test_constructors_and_binding(tree: SourceTree) -> None:
    child, fields = tree.resolve("pkg.sub.Child"), tree.resolve("pkg.sub.Fields")
    assert child is not None and fields is not None
    signature = tree.constructor(child)  # **kwargs handed to super().__init__: Base's
    assert str(signature) == "(*args, extra=..., a=..., flag=..., **kwargs)"
    assert binding_problems(signature, 1, frozenset({"flag", "extra"})) == []
    assert binding_problems(signature, 1, frozenset({"other"})) == [
        "has no parameter 'other' (a keyword we pass)"
    ]
    dataclass = tree.constructor(fields)
    assert str(dataclass) == "(*, one, two=...)"
    assert binding_problems(dataclass, 0, frozenset({"two"})) == [
        "requires 'one', which we do not pass"
    ]
    method = tree.resolve("pkg.sub.Base.method")
    assert method is not None
    assert binding_problems(tree.signature(method), 3) == [
        "takes 2 positional argument(s), we pass 3"
    ]
    assert inspect.Parameter.empty is not wheel_sources.DEFAULT

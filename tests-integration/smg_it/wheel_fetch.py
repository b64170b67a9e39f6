"""A published wheel's files, read without downloading or installing it (what
:mod:`smg_it.wheel_sources` reads its sources from).

:class:`WheelSources` finds a release's wheel in the package index (the PEP 691 JSON simple
index), opens it with :mod:`zipfile` over HTTP Range requests (:class:`RangeFile`: the central
directory and the members asked for, never the whole file; wheels are 100-400 MB) and keeps what
it read under ``<cache>/<project>-<version>/``:

- ``wheel.json``: the index's file (name, URL, size), so a later run needs no index;
- ``names.txt``: every member of the wheel (which modules exist);
- ``files/<member>``: each member read, checked against the zip's CRC on the way.

Every file is written atomically (a temporary file renamed), so two test processes may fill one
cache at once. A run whose members are all cached makes no request. Every network wait is bounded
(:data:`TIMEOUT_S`, :data:`ATTEMPTS`); when the index cannot be reached, :class:`WheelUnavailable`
says what was being read and why.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INDEX_URL = "https://pypi.org/simple/{project}/"
INDEX_ACCEPT = "application/vnd.pypi.simple.v1+json"
#: Seconds one request may wait (connect, or any read).
TIMEOUT_S = 60.0
#: Tries per request (a connection error, a timeout, HTTP 429 or 5xx are tried again), the n-th
#: retry after ``BACKOFF_S * 2**(n-1)`` seconds.
ATTEMPTS = 3
BACKOFF_S = 1.0
#: Bytes fetched per Range request; the last few blocks are kept (one member is one or two).
BLOCK = 256 * 1024
KEPT_BLOCKS = 8
#: A manylinux x86_64 wheel.
MANYLINUX_X86_64 = re.compile(r"manylinux.*_x86_64")


class WheelUnavailable(RuntimeError):
    """The index or the wheel could not be read (and the cache does not hold what was asked)."""


def _request(url: str, headers: dict[str, str], what: str, *, partial: bool = False) -> bytes:
    """The body of ``url``; with ``partial``, only a 206 answer is read (a server that ignores
    the Range header would send the whole wheel)."""
    failure: BaseException | None = None
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                if partial and response.status != 206:
                    raise WheelUnavailable(
                        f"{what}: {url} answered {response.status} to a Range request, not 206"
                    )
                return response.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 429 and exc.code < 500:
                raise WheelUnavailable(f"{what}: HTTP {exc.code} from {url}") from exc
            failure = exc
        except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as exc:
            failure = exc
    raise WheelUnavailable(
        f"{what}: {url} not read in {ATTEMPTS} attempts (last: {type(failure).__name__}: {failure})"
    ) from failure


@dataclass(frozen=True)
class Wheel:
    """One file of the index."""

    project: str
    version: str
    filename: str
    url: str
    size: int


_WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)


def _normalized(name: str, separator: str) -> str:
    return re.sub(r"[-_.]+", separator, name).lower()


def find_wheel(project: str, version: str, platform: re.Pattern[str] = MANYLINUX_X86_64) -> Wheel:
    """``project`` ``version``'s wheel for ``platform`` (a platform tag that matches it), not
    yanked; the highest build tag when the index has several."""
    url = INDEX_URL.format(project=_normalized(project, "-"))
    body = _request(url, {"Accept": INDEX_ACCEPT}, f"the index of {project}")
    try:
        files: list[dict[str, Any]] = json.loads(body)["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WheelUnavailable(f"the index of {project} at {url} is not PEP 691 JSON") from exc
    candidates: list[tuple[int, dict[str, Any]]] = []
    for entry in files:
        match = _WHEEL_NAME.match(str(entry.get("filename", "")))
        if (
            match is None
            or _normalized(match["name"], "_") != _normalized(project, "_")
            or match["version"] != version
            or not platform.search(match["platform"])
            or entry.get("yanked")
        ):
            continue
        build = re.match(r"\d+", match["build"] or "0")
        candidates.append((int(build.group()) if build else 0, entry))
    if not candidates:
        raise WheelUnavailable(
            f"the index of {project} ({url}) has no {version} wheel for {platform.pattern}"
        )
    entry = max(candidates, key=lambda c: c[0])[1]
    return Wheel(project, version, str(entry["filename"]), str(entry["url"]), int(entry["size"]))


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP Range requests, read in :data:`BLOCK`-sized blocks
    (the last :data:`KEPT_BLOCKS` kept)."""

    def __init__(self, url: str, size: int, what: str) -> None:
        super().__init__()
        self.url, self.size, self.what = url, size, what
        self.position = 0
        self.requests = 0
        self._blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(base + offset, 0)
        return self.position

    def _block(self, index: int) -> bytes:
        block = self._blocks.pop(index, None)
        if block is None:
            start = index * BLOCK
            end = min(start + BLOCK, self.size) - 1
            headers = {"Range": f"bytes={start}-{end}"}
            block = _request(self.url, headers, self.what, partial=True)
            self.requests += 1
            if len(block) != end - start + 1:
                raise WheelUnavailable(
                    f"{self.what}: bytes {start}-{end} of {self.url} came back as "
                    f"{len(block)} bytes"
                )
        self._blocks[index] = block  # most recently used last
        while len(self._blocks) > KEPT_BLOCKS:
            del self._blocks[next(iter(self._blocks))]
        return block

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), max(self.size - self.position, 0))
        done = 0
        while done < wanted:
            index, offset = divmod(self.position, BLOCK)
            chunk = self._block(index)[offset : offset + wanted - done]
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
            self.position += len(chunk)
        return done


def write_atomically(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part (another process may be
    writing the same file: the last rename wins, with the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class WheelSources:
    """The member names and sources of ``project`` ``version``'s wheel, read from the cache
    folder ``cache/<project>-<version>`` or, for what it lacks, from the index."""

    def __init__(
        self,
        project: str,
        version: str,
        cache: Path,
        platform: re.Pattern[str] = MANYLINUX_X86_64,
    ) -> None:
        self.project, self.version, self.platform = project, version, platform
        self.folder = cache / f"{project}-{version}"
        self.label = f"{project} {version}"
        #: Members read from the index by this object (0: everything came from the cache).
        self.fetched = 0
        self._zip: zipfile.ZipFile | None = None
        self._range: RangeFile | None = None
        self._names: frozenset[str] | None = None

    @property
    def requests(self) -> int:
        """HTTP Range requests made for the wheel by this object."""
        return self._range.requests if self._range is not None else 0

    def wheel(self) -> Wheel:
        path = self.folder / "wheel.json"
        if path.is_file():
            return Wheel(**json.loads(path.read_text()))
        wheel = find_wheel(self.project, self.version, self.platform)
        write_atomically(path, json.dumps(wheel.__dict__, indent=1).encode())
        return wheel

    def _archive(self) -> zipfile.ZipFile:
        if self._zip is None:
            wheel = self.wheel()
            self._range = RangeFile(wheel.url, wheel.size, f"{self.label} ({wheel.filename})")
            try:
                self._zip = zipfile.ZipFile(self._range)
            except zipfile.BadZipFile as exc:
                raise WheelUnavailable(f"{self.label}: {wheel.url} is not a zip: {exc}") from exc
        return self._zip

    def names(self) -> frozenset[str]:
        """Every member's path in the wheel."""
        if self._names is None:
            path = self.folder / "names.txt"
            if path.is_file():
                self._names = frozenset(path.read_text().split("\n"))
            else:
                listed = sorted(self._archive().namelist())
                write_atomically(path, "\n".join(listed).encode())
                self._names = frozenset(listed)
        return self._names

    def read(self, member: str) -> str | None:
        """The member's text, or None when the wheel has no such member."""
        if member not in self.names():
            return None
        path = self.folder / "files" / member
        if path.is_file():
            return path.read_text(encoding="utf-8")
        try:
            data = self._archive().read(member)  # zipfile checks the CRC
        except zipfile.BadZipFile as exc:
            raise WheelUnavailable(f"{self.label}: member {member}: {exc}") from exc
        self.fetched += 1
        write_atomically(path, data)
        return data.decode("utf-8")

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None

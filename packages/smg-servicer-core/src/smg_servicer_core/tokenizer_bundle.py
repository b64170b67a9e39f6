"""The ``GetTokenizer`` bundle, exactly as the SMG router accepts it.

Contract (router ``tokenizer_bundle.rs``):

- a **flat** zip (bare file names, ZIP_DEFLATED) of the allow-listed tokenizer files found at the
  top level of the tokenizer directory;
- streamed as ``GetTokenizerChunk`` messages of at most 64 KiB whose ``data`` concatenates to the
  zip; the lowercase hex SHA-256 of the **whole** zip is set on the **last** chunk only;
- the router refuses more than 200 MiB streamed, 50 entries or 500 MiB uncompressed, so the
  builder refuses the same before anything is sent.

Only names on the allow-list ever leave the directory. A file must be a regular file after
resolving links, and the resolved file must lie inside the directory, or, for the Hugging Face
cache layout (``<repo>/snapshots/<rev>/name -> ../../blobs/<hash>``), inside that repo's ``blobs``.

The bundle is built once per directory, in a worker thread, and shared by concurrent callers; a
failed build is not cached, so the next call tries again. Zip entries carry a fixed timestamp, so
the same files always give the same bytes and digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from smg_servicer_core import hf_cache
from smg_servicer_core.errors import FailedPrecondition
from smg_servicer_core.proto import common_pb2

logger = logging.getLogger(__name__)

CHUNK_SIZE = 64 * 1024

#: Exact names, in bundle order.
ALLOWED_NAMES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "tokenizer.model",
    "tiktoken.model",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
#: Suffixes whose files are added after the exact names, sorted by name.
ALLOWED_SUFFIXES: tuple[str, ...] = (".tiktoken", ".jinja", ".model")

# Router-side limits (tokenizer_bundle.rs).
MAX_ENTRIES = 50
MAX_UNCOMPRESSED_BYTES = 500 * 1024 * 1024
MAX_ZIP_BYTES = 200 * 1024 * 1024

_FIXED_DATE = (2020, 1, 1, 0, 0, 0)


class BundleError(FailedPrecondition):
    """The directory cannot be bundled (missing, empty, over the limits)."""


@dataclass(frozen=True)
class TokenizerBundle:
    data: bytes
    sha256: str
    names: tuple[str, ...]

    def chunks(self, chunk_size: int = CHUNK_SIZE) -> Iterator[common_pb2.GetTokenizerChunk]:
        """The stream: ``chunk_size`` slices, the digest on the last one only."""
        total = len(self.data)
        for start in range(0, total, chunk_size):
            end = min(start + chunk_size, total)
            yield common_pb2.GetTokenizerChunk(
                data=self.data[start:end], sha256=self.sha256 if end == total else ""
            )


def _allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.endswith(ALLOWED_SUFFIXES)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _safe_file(directory: Path, name: str) -> Path | None:
    """The resolved file for ``name`` if it may be shipped, else None."""
    candidate = directory / name
    if not candidate.is_file():
        return None
    resolved = candidate.resolve()
    roots = [directory]
    if directory.parent.name == "snapshots":  # HF cache: <repo>/snapshots/<rev>/
        roots.append((directory.parent.parent / "blobs").resolve())
    if not any(_inside(resolved, root) for root in roots):
        logger.warning("tokenizer bundle: %s points outside the model directory; skipped", name)
        return None
    return resolved


def select_files(directory: Path) -> list[tuple[str, Path]]:
    """The (bundle name, file) pairs to ship from ``directory``, in bundle order."""
    directory = directory.resolve()
    present = sorted(p.name for p in directory.iterdir())
    ordered = [n for n in ALLOWED_NAMES if n in present]
    ordered += [n for n in present if n not in ordered and _allowed(n)]
    selected: list[tuple[str, Path]] = []
    for name in ordered:
        resolved = _safe_file(directory, name)
        if resolved is not None:
            selected.append((name, resolved))
    return selected


def build_bundle(directory: str | Path) -> TokenizerBundle:
    """Build the zip for ``directory``. Blocking; call it off the event loop."""
    root = Path(directory)
    if not root.is_dir():
        raise BundleError("Tokenizer path is not a directory on this server.")
    files = select_files(root)
    if not files:
        raise BundleError("No tokenizer files found in the tokenizer directory.")
    if len(files) > MAX_ENTRIES:
        raise BundleError(f"Tokenizer directory has more than {MAX_ENTRIES} bundle files.")
    if sum(path.stat().st_size for _, path in files) > MAX_UNCOMPRESSED_BYTES:
        raise BundleError("Tokenizer files exceed the router's 500 MiB bundle limit.")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, path in files:
            info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    if len(data) > MAX_ZIP_BYTES:
        raise BundleError("Tokenizer bundle exceeds the router's 200 MiB limit.")
    return TokenizerBundle(
        data=data, sha256=hashlib.sha256(data).hexdigest(), names=tuple(n for n, _ in files)
    )


def _bundle_dir(directory: str | Path) -> Path:
    """``directory``, or for a Hugging Face id (what vLLM and SGLang keep as the tokenizer when
    ``--model`` was one) the cached snapshot the engine loaded it from."""
    path = Path(directory)
    if path.is_dir():
        return path
    return hf_cache.cached_snapshot(str(directory)) or path


class TokenizerBundleCache:
    """One bundle per directory, built once and shared by concurrent callers."""

    def __init__(self) -> None:
        self._ready: dict[Path, TokenizerBundle] = {}
        self._building: dict[Path, asyncio.Task[TokenizerBundle]] = {}
        self.builds = 0  # how many builds ran (observable in tests)

    def _build_counted(self, directory: Path) -> TokenizerBundle:
        self.builds += 1
        return build_bundle(directory)

    async def get(self, directory: str | Path | None) -> TokenizerBundle:
        if not directory:
            raise FailedPrecondition("Tokenizer path is not configured on this server.")
        key = _bundle_dir(directory)
        cached = self._ready.get(key)
        if cached is not None:
            return cached
        task = self._building.get(key)
        if task is None:
            task = asyncio.create_task(asyncio.to_thread(self._build_counted, key))
            self._building[key] = task
            task.add_done_callback(lambda t: self._settle(key, t))
        # shield: a caller that is cancelled must not cancel the build other callers await.
        return await asyncio.shield(task)

    def _settle(self, key: Path, task: asyncio.Task[TokenizerBundle]) -> None:
        self._building.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            self._ready[key] = task.result()

    async def stream(self, directory: str | Path | None) -> Iterator[common_pb2.GetTokenizerChunk]:
        """Chunks for ``GetTokenizer``; raises a :class:`ServicerError` subclass on failure."""
        bundle = await self.get(directory)
        return bundle.chunks()

"""LoRA adapters over gRPC: the tokenizer manager's part of SGLang's adapter lifecycle.

SGLang keeps its adapters' truth in two places: each scheduler rank's ``LoRAManager`` (the
weights, by a unique ``lora_id``), and the tokenizer manager's ``LoRARegistry`` (names -> ids, and
how many requests use each id). This servicer takes the tokenizer manager's role, so it holds
SGLang's own registry (:class:`Adapters`) and does what SGLang's tokenizer manager does:

- **Generate** with ``lora_id``: the adapter's id, or its name (``--lora-paths a=DIR`` adapters
  are known by name; ``ListLoadedLoRAAdapters`` shows both), is resolved in the registry and
  counted as in use until the request ends; the scheduler gets the registered id. A name or id
  that is not loaded, or any ``lora_id`` on a worker started without ``--enable-lora`` →
  INVALID_ARGUMENT naming it: never the base model silently, never an unknown id in the scheduler
  (SGLang's scheduler asserts on one and dies).
- **LoadLoRAAdapter**: off unless the operator names the folders adapters may be loaded from
  (``--lora-allowed-dirs`` / ``SMG_SGLANG_SERVICER_LORA_ALLOWED_DIRS``, ``:``-separated): a
  remote caller chooses the path, so it must be absolute, hold no ``..``, resolve (symlinks
  followed) inside an allowed folder, and be an adapter folder (``adapter_config.json`` of a LoRA
  within the engine's ``--max-lora-rank``, and ``adapter_model.safetensors`` or ``.bin``, each
  inside the allowed folders too). The scheduler ranks load the resolved path; the registry
  takes the adapter when every rank did. ``lora_id`` is the caller's (minted here when empty).
- **UnloadLoRAAdapter** by name (and id, when given, which must match): the adapter leaves the
  registry at once, so new requests naming it are refused, and the ranks unload it once the
  requests that use it have ended (SGLang's own order). The unload goes on if the caller
  leaves; a second unload of the same name waits for the same one.
- **ListLoadedLoRAAdapters**: the registry (start-up adapters included).

Errors are gRPC statuses: loads off → FAILED_PRECONDITION; a path outside the allowed folders →
PERMISSION_DENIED (whether it exists is not said); ``..``, a relative path, a folder that is not
an adapter, a rank over the engine's → INVALID_ARGUMENT; a name already loaded → ALREADY_EXISTS;
no adapter there → NOT_FOUND; the engine refusing the weights → INVALID_ARGUMENT with the
adapter's name (the engine's own message goes to the log). SGLang loads adapters at run time on
one DP rank only, as its tokenizer manager does (FAILED_PRECONDITION with more).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import uuid
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, cast

from smg_servicer_core.config import Setting
from smg_servicer_core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ServicerError,
)
from smg_servicer_core.metrics import ServicerMetrics
from smg_servicer_sglang import _sglang as sg

logger = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
#: An adapter's config is a few hundred bytes; anything past this is not one.
MAX_CONFIG_BYTES = 1 << 20
MAX_PATH_CHARS = 4096
#: Adapter names and ids: what SGLang and the router use as model suffixes and keys.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+/-]{0,127}")
#: How long the ranks may take to load or unload one adapter.
UPDATE_TIMEOUT_S = 120.0


def parse_dirs(raw: str) -> tuple[Path, ...]:
    """``DIR[:DIR...]``: absolute, existing folders (their real paths)."""
    dirs: list[Path] = []
    for part in (p.strip() for p in raw.split(os.pathsep)):
        if not part:
            continue
        if not os.path.isabs(part):
            raise ValueError(f"{part!r} is not an absolute path")
        real = Path(os.path.realpath(part))
        if not real.is_dir():
            raise ValueError(f"{part!r} is not a folder")
        dirs.append(real)
    return tuple(dirs)


ALLOWED_DIRS = Setting(
    "lora_allowed_dirs",
    parse_dirs,
    (),
    "folders LoadLoRAAdapter may load adapters from, ':'-separated (none: run-time loads off)",
    flag="--lora-allowed-dirs",
    env="SMG_SGLANG_SERVICER_LORA_ALLOWED_DIRS",
)


def check_name(what: str, value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        shown = value[:64] + ("..." if len(value) > 64 else "")
        raise InvalidRequest(
            f"{what} {shown!r} is not a valid adapter name: 1-128 characters of letters, digits "
            "and ._@+/-, starting with a letter or digit"
        )
    return value


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def confine(raw: str, roots: tuple[Path, ...]) -> Path:
    """The adapter folder ``raw`` names, resolved, once it is inside ``roots`` and holds an
    adapter; raises the error the caller gets otherwise. ``raw`` is shown as given, never what
    it resolves to."""
    if not roots:
        raise FailedPrecondition(
            "run-time adapter loads are off on this worker: start it with --lora-allowed-dirs "
            "(or SMG_SGLANG_SERVICER_LORA_ALLOWED_DIRS) naming the folders adapters may come "
            "from, or load adapters at start-up with SGLang's --lora-paths"
        )
    if not raw or len(raw) > MAX_PATH_CHARS or "\x00" in raw:
        raise InvalidRequest("lora_path must be an absolute path of at most 4096 characters")
    shown = repr(raw[:256])
    if not os.path.isabs(raw):
        raise InvalidRequest(f"lora_path {shown} is not an absolute path")
    if ".." in PurePosixPath(raw).parts:
        raise InvalidRequest(f"lora_path {shown} must not contain '..'")
    real = Path(os.path.realpath(raw))
    if not _inside(real, roots):
        raise PermissionDenied(f"lora_path {shown} is outside the folders this worker allows")
    try:
        return _adapter_folder(real, roots, shown)
    except OSError as exc:  # a name too long, a loop of links, no permission
        raise InvalidRequest(f"lora_path {shown} cannot be read as an adapter folder") from exc


def _adapter_folder(real: Path, roots: tuple[Path, ...], shown: str) -> Path:
    if not real.is_dir():
        raise NotFound(f"no adapter folder at lora_path {shown}")
    config = _member(real, CONFIG_FILE, roots, shown)
    if config is None:
        raise InvalidRequest(f"lora_path {shown} is not an adapter folder (no {CONFIG_FILE})")
    if not any(_member(real, name, roots, shown) for name in WEIGHT_FILES):
        raise InvalidRequest(
            f"lora_path {shown} is not an adapter folder (no {' or '.join(WEIGHT_FILES)})"
        )
    return real


def _member(folder: Path, name: str, roots: tuple[Path, ...], shown: str) -> Path | None:
    """``folder/name`` when it is a regular file inside ``roots`` (a link out of them is refused
    as the folder would be); None when absent."""
    path = folder / name
    if not path.exists() and not path.is_symlink():
        return None
    real = Path(os.path.realpath(path))
    if not _inside(real, roots):
        raise PermissionDenied(f"{name} of lora_path {shown} is outside the allowed folders")
    if not real.is_file():
        raise InvalidRequest(f"{name} of lora_path {shown} is not a file")
    return real


def adapter_rank(folder: Path, shown: str) -> int:
    """The LoRA rank of the adapter in ``folder`` (its ``adapter_config.json``)."""
    path = folder / CONFIG_FILE
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError("too large")
        config: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{CONFIG_FILE} of {shown} is not a readable JSON file") from exc
    if not isinstance(config, dict):
        raise InvalidRequest(f"{CONFIG_FILE} of {shown} is not a JSON object")
    fields = cast("dict[str, object]", config)
    peft_type = str(fields.get("peft_type") or "LORA").upper()
    rank = fields.get("r")
    if peft_type != "LORA" or not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidRequest(f"{CONFIG_FILE} of {shown} does not describe a LoRA adapter")
    return rank


@dataclass
class Adapters:
    """SGLang's adapter registry in the servicer, and the loads and unloads that change it."""

    enabled: bool
    manager: Any
    #: Adapters loaded at start-up (SGLang's ``--lora-paths``, resolved to ``LoRARef``).
    preloaded: list[Any] = field(default_factory=list[Any])
    allowed_dirs: tuple[Path, ...] = ()
    max_rank: int | None = None
    metrics: ServicerMetrics | None = None
    registry: Any = None
    _unloads: dict[str, asyncio.Task[list[str]]] = field(default_factory=dict[str, Any])
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        if self.registry is None:
            self.registry = sg.LoRARegistry(self.preloaded or None)

    @classmethod
    def of(cls, config: Any, manager: Any, allowed_dirs: tuple[Path, ...] = ()) -> Adapters:
        """From SGLang's resolved settings (``--enable-lora``, ``--lora-paths``,
        ``--max-lora-rank``)."""
        enabled = bool(getattr(config, "enable_lora", False))
        preloaded = list(getattr(config, "lora_paths", None) or []) if enabled else []
        max_rank = getattr(config, "max_lora_rank", None)
        return cls(
            enabled=enabled,
            manager=manager,
            preloaded=preloaded,
            allowed_dirs=allowed_dirs,
            max_rank=int(max_rank) if max_rank else None,
        )

    # -- what is loaded --------------------------------------------------------------------

    def loaded(self) -> dict[str, Any]:
        """Name -> ``LoRARef`` of every adapter requests may use now."""
        return dict(self.registry.get_all_adapters())

    def ids(self) -> list[str]:
        return sorted(ref.lora_id for ref in self.loaded().values())

    def count(self) -> int:
        return len(self.loaded())

    def _find(self, key: str) -> Any:
        refs = self.loaded().values()
        by_id = next((r for r in refs if r.lora_id == key), None)
        return by_id or next((r for r in refs if r.lora_name == key), None)

    # -- a request's adapter ---------------------------------------------------------------

    @asynccontextmanager
    async def use(self, key: str) -> AsyncGenerator[tuple[str, str] | None]:
        """The adapter ``key`` (an id or a name) names, ``(lora_id, lora_name)``, counted in use
        while the block runs; None for no adapter (an empty ``key``)."""
        if not key:
            yield None
            return
        shown = key[:128]
        if not self.enabled:
            raise InvalidRequest(
                f"lora_id {shown!r}: this worker serves no LoRA adapters (start it with "
                "--enable-lora)"
            )
        ref = self._find(key)
        if ref is None:
            raise InvalidRequest(
                f"lora_id {shown!r} names no loaded adapter (ListLoadedLoRAAdapters lists them)"
            )
        try:
            lora_id = await self.registry.acquire(ref.lora_name)
        except ValueError as exc:  # unloaded between the lookup and here
            raise InvalidRequest(f"lora_id {shown!r} names no loaded adapter") from exc
        try:
            if lora_id != ref.lora_id:  # unloaded and loaded again under a new id meanwhile
                raise InvalidRequest(f"lora_id {shown!r} names no loaded adapter")
            yield (lora_id, ref.lora_name)
        finally:
            await self.registry.release(lora_id)

    # -- loads and unloads -----------------------------------------------------------------

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise FailedPrecondition(
                "this worker was started without --enable-lora: it cannot load adapters"
            )
        if self.manager.dp_size > 1:
            raise FailedPrecondition(
                "adapters load at run time on a worker with one DP rank (SGLang's own rule); "
                "load them at start-up with --lora-paths"
            )

    def _count(self, op: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.lora_update(op, outcome)

    async def load(self, name: str, path: str, *, pinned: bool, lora_id: str) -> list[str]:
        """Load the adapter at ``path`` as ``name``; the loaded ids after it."""
        try:
            self._check_enabled()
            check_name("lora_name", name)
            if lora_id:
                check_name("lora_id", lora_id)
            folder = confine(path, self.allowed_dirs)
            rank = adapter_rank(folder, repr(path[:256]))
            if self.max_rank is not None and rank > self.max_rank:
                raise InvalidRequest(
                    f"adapter {name!r} has rank {rank}; this worker serves ranks up to "
                    f"{self.max_rank} (--max-lora-rank)"
                )
        except (InvalidRequest, PermissionDenied, NotFound, FailedPrecondition):
            self._count("load", "refused")
            raise
        async with self._lock:
            try:
                self._check_free(name, lora_id)
            except (AlreadyExists, FailedPrecondition):
                self._count("load", "refused")
                raise
            ref = sg.LoRARef(
                lora_id=lora_id or uuid.uuid4().hex,
                lora_name=name,
                lora_path=str(folder),
                pinned=pinned,
            )
            request = sg.LoadLoRAAdapterReqInput(
                lora_name=name, lora_path=str(folder), pinned=pinned, lora_id=ref.lora_id
            )
            try:
                replies, failed = await self._update(request, "the engine refused adapter", name)
            except ServicerError:  # the ranks did not answer in time, or the server stops
                self._count("load", "failed")
                raise
            if failed:
                if len(failed) < len(replies):  # some ranks hold it: take it back out of them
                    await self._unload_in_ranks(name, ref.lora_id)
                self._count("load", "refused")
                raise InvalidRequest(
                    f"the engine could not load adapter {name!r} (its weights or target "
                    "modules do not fit this model and the worker's LoRA settings; the worker's "
                    "log has the engine's message)"
                )
            await self.registry.register(ref)
        self._count("load", "ok")
        logger.info("adapter %r loaded (id %s)", name, ref.lora_id)
        return self.ids()

    def _check_free(self, name: str, lora_id: str) -> None:
        if name in self._unloads:
            raise FailedPrecondition(
                f"adapter {name!r} is being unloaded (requests still use it); load it again "
                "once UnloadLoRAAdapter returns"
            )
        if name in self.loaded():
            raise AlreadyExists(f"an adapter named {name!r} is already loaded")
        if lora_id and self._find(lora_id) is not None:
            raise AlreadyExists(f"an adapter with lora_id {lora_id!r} is already loaded")

    async def unload(self, name: str, lora_id: str = "") -> list[str]:
        """Unload ``name`` once no request uses it; the loaded ids after it. Shielded: the unload
        finishes even if the caller leaves."""
        task = self._unloads.get(name)
        if task is None:
            try:
                self._check_enabled()
                check_name("lora_name", name)
                ref = self.loaded().get(name)
                if ref is None:
                    raise NotFound(f"no adapter named {name!r} is loaded")
                if lora_id and lora_id != ref.lora_id:
                    raise InvalidRequest(
                        f"adapter {name!r} is loaded under another lora_id than {lora_id[:128]!r}"
                    )
            except (InvalidRequest, NotFound, FailedPrecondition):
                self._count("unload", "refused")
                raise
            task = asyncio.get_running_loop().create_task(self._unload(name))
            self._unloads[name] = task
            task.add_done_callback(lambda _t: self._unloads.pop(name, None))
        return await asyncio.shield(task)

    async def _unload(self, name: str) -> list[str]:
        lora_id = await self.registry.unregister(name)  # new requests are refused from here
        await self.registry.wait_for_unload(lora_id)  # the requests using it have ended
        async with self._lock:
            try:
                ok = await self._unload_in_ranks(name, lora_id)
            except ServicerError:
                ok = False
        self._count("unload", "ok" if ok else "failed")
        if not ok:
            raise ServicerError(
                f"adapter {name!r} left the registry (no request can use it) but the engine did "
                "not confirm the unload; the worker's log has the engine's message"
            )
        logger.info("adapter %r unloaded", name)
        return self.ids()

    async def _unload_in_ranks(self, name: str, lora_id: str) -> bool:
        request = sg.UnloadLoRAAdapterReqInput(lora_name=name, lora_id=lora_id)
        _, failed = await self._update(request, "the engine did not unload adapter", name)
        return not failed

    async def _update(self, request: Any, failure: str, name: str) -> tuple[list[Any], list[Any]]:
        """Send a load or unload to every rank: (their replies, the failed ones, logged: the
        engine's messages go to the log, not to the caller)."""
        replies = await self.manager.control(request, sg.LoRAUpdateOutput, UPDATE_TIMEOUT_S)
        failed = [r for r in replies if not r.success]
        if failed:
            messages = " | ".join(str(r.error_message or "") for r in failed)
            logger.warning("%s %r: %s", failure, name, messages)
        return replies, failed

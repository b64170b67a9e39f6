"""Tensors the router sends (``TensorData`` of any wire), read into checked raw bytes, engine-free.

Every wire's ``TensorData`` has ``shape`` and ``dtype``; vLLM's and TokenSpeed's have a payload
``inline`` (the bytes in the message), ``shm`` (a same-host POSIX shared-memory segment: ``name``,
``offset``, ``nbytes``) or ``remote`` (another transport), SGLang's only ``data`` (inline bytes).
:func:`read_tensor` checks the dtype, that the shape's size matches the payload, and bounds the
size; a shared-memory segment is read and then unlinked (the router
hands it over, the worker frees it). Every failure is INVALID_ARGUMENT (``remote``: UNIMPLEMENTED)
with a message naming the field, never the raw OS error.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

from smg_servicer_core.errors import InvalidRequest, Unsupported

logger = logging.getLogger(__name__)

#: dtype name -> bytes per element (little-endian, as the router writes them).
ITEM_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint32": 4,
    "bool": 1,
}
#: The largest tensor read by default (a 4K RGB frame in float32 is ~100 MB).
MAX_TENSOR_BYTES = 1 << 30
_SHM_NAME = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")


@dataclass(frozen=True)
class RawTensor:
    """A checked tensor: dtype name, shape, and exactly ``prod(shape) * itemsize`` bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _read_shm(name: str, offset: int, nbytes: int, where: str) -> bytes:
    if not _SHM_NAME.match(name):
        raise InvalidRequest(f"{where}: shared-memory name {name!r} is not valid")
    try:
        segment = shared_memory.SharedMemory(name=name.lstrip("/"), create=False)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{where}: shared-memory segment {name!r} cannot be opened") from exc
    try:
        if offset + nbytes > segment.size:
            raise InvalidRequest(
                f"{where}: shared-memory range {offset}+{nbytes} exceeds the segment "
                f"({segment.size} bytes)"
            )
        view = segment.buf
        if view is None:
            raise InvalidRequest(f"{where}: shared-memory segment {name!r} cannot be read")
        return bytes(view[offset : offset + nbytes])
    finally:
        segment.close()
        try:
            segment.unlink()
        except OSError:
            logger.warning("shared-memory segment %s was already gone", name)


def _payload_kind(message: Any) -> str | None:
    if "payload" not in message.DESCRIPTOR.oneofs_by_name:
        return "data"
    return message.WhichOneof("payload")


def read_tensor(message: Any, where: str, *, max_bytes: int = MAX_TENSOR_BYTES) -> RawTensor:
    """``message`` (a ``TensorData``) as a :class:`RawTensor`; ``where`` names it in errors."""
    dtype = str(message.dtype)
    itemsize = ITEM_SIZES.get(dtype)
    if itemsize is None:
        raise InvalidRequest(f"{where}: dtype {dtype!r} is not one of {', '.join(ITEM_SIZES)}")
    shape = tuple(int(d) for d in message.shape)
    expected = math.prod(shape) * itemsize
    if expected > max_bytes:
        raise InvalidRequest(f"{where}: {expected} bytes is over the {max_bytes}-byte limit")
    kind = _payload_kind(message)
    if kind == "data":  # SGLang's wire: inline bytes only
        data = bytes(message.data)
    elif kind == "inline":
        data = bytes(message.inline)
    elif kind == "shm":
        handle = message.shm
        if int(handle.nbytes) != expected:
            raise InvalidRequest(
                f"{where}: shape {list(shape)} of {dtype} is {expected} bytes, the shared-memory "
                f"handle holds {handle.nbytes}"
            )
        data = _read_shm(str(handle.name), int(handle.offset), int(handle.nbytes), where)
    elif kind == "remote":
        raise Unsupported(f"{where}: remote tensor transports are not supported by this worker")
    else:
        raise InvalidRequest(f"{where}: the tensor has no payload")
    if len(data) != expected:
        raise InvalidRequest(
            f"{where}: shape {list(shape)} of {dtype} is {expected} bytes, got {len(data)}"
        )
    return RawTensor(dtype, shape, data)


def release_shm(messages: Iterable[Any]) -> int:
    """Unlink the shared-memory segments of ``messages`` (``TensorData``) that are still there; the
    number unlinked. For a request refused as the client's fault before its tensors were read: the
    router handed the segments over, so the worker frees them either way. (A retryable refusal
    leaves them: the router may send the same handles to another worker.)"""
    released = 0
    for message in messages:
        if _payload_kind(message) != "shm" or not _SHM_NAME.match(message.shm.name):
            continue
        try:
            segment = shared_memory.SharedMemory(name=str(message.shm.name).lstrip("/"))
        except (OSError, ValueError):
            continue  # already read and unlinked, or never there
        segment.close()
        try:
            segment.unlink()
            released += 1
        except OSError:
            continue
    return released


def shm_namespace_id() -> str:
    """``<boot id>:<device of /dev/shm>``: two workers with the same value share the router's
    shared-memory segments (same host, same mount), so the router may send them ``shm`` tensors.
    Empty when either cannot be read (the router then sends inline bytes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        device = os.stat("/dev/shm").st_dev
    except OSError:
        return ""
    return f"{boot}:{device}" if boot else ""

"""What ``GetServerInfo`` shows of TokenSpeed's configuration, pure: the server arguments made
JSON-safe (cycles, objects, enums, paths and sets become JSON values) with every secret removed at
any depth, plus the labels the router reads.

A key is a secret when it is ``token``, ends in ``_token``, or contains ``key``, ``secret`` or
``password`` (case-insensitive): ``hf_token``, ``api_key``, ``rl_control_api_key``,
``ssl_keyfile_password``... Such keys are dropped, not masked, so no value or length leaks.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, cast

#: Deeper structures are cut here (a label, never a secret).
MAX_DEPTH = 12
_SECRET_PARTS = ("key", "secret", "password")


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return (
        lowered == "token"
        or lowered.endswith("_token")
        or any(part in lowered for part in _SECRET_PARTS)
    )


_SCALAR_MISS = object()


def _scalar(value: Any) -> Any:
    """``value`` as a JSON scalar, or ``_SCALAR_MISS`` when it is a structure."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return _scalar(value.value)
    if isinstance(value, PurePath):
        return str(value)
    return _SCALAR_MISS


def _fields(value: Any) -> Any:
    """A dataclass or plain object as its public fields; anything else unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if not isinstance(value, Mapping | list | tuple | set | frozenset) and hasattr(
        value, "__dict__"
    ):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    return cast(Any, value)


def json_safe(value: Any, _depth: int = 0, _seen: frozenset[int] = frozenset()) -> Any:
    """``value`` as JSON data (dict keys as strings), secrets dropped at any depth."""
    scalar = _scalar(value)
    if scalar is not _SCALAR_MISS:
        return scalar
    if _depth >= MAX_DEPTH:
        return f"<{type(value).__name__}>"
    if id(value) in _seen:
        return f"<cycle: {type(value).__name__}>"
    seen = _seen | {id(value)}
    value = _fields(value)
    if isinstance(value, Mapping):
        return {
            str(k): json_safe(v, _depth + 1, seen)  # pyright: ignore[reportUnknownArgumentType]
            for k, v in value.items()  # pyright: ignore[reportUnknownVariableType]
            if not is_secret(str(k))  # pyright: ignore[reportUnknownArgumentType]
        }
    if isinstance(value, list | tuple | set | frozenset):
        items: list[Any] = (
            sorted(value, key=repr) if isinstance(value, set | frozenset) else list(value)  # pyright: ignore[reportUnknownArgumentType]
        )
        return [json_safe(item, _depth + 1, seen) for item in items]
    return str(value)


def server_args(args: Any, labels: Mapping[str, Any]) -> dict[str, Any]:
    """The ``server_args`` Struct's content: TokenSpeed's arguments, then the labels."""
    values = json_safe(args)
    out: dict[str, Any] = values if isinstance(values, dict) else {"value": values}  # pyright: ignore[reportUnknownVariableType]
    out.update(json_safe(dict(labels)))
    # The Struct is JSON: one round trip proves it (and normalises ints to numbers).
    return json.loads(json.dumps(out))

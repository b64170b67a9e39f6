"""An engine's ``--kv-events-config``: a JSON object (SGLang and TokenSpeed take it as a string)."""

from __future__ import annotations

import json
from typing import Any

from smg_servicer_core.errors import ConfigError


def parse_config(raw: object) -> dict[str, Any] | None:
    """The KV-events config as a dict (None when unset); ConfigError when it is not a JSON
    object."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, dict):
        return dict(raw)  # pyright: ignore[reportUnknownArgumentType]
    try:
        value = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kv-events-config is not valid JSON: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise ConfigError("--kv-events-config must be a JSON object")
    return value  # pyright: ignore[reportUnknownVariableType]

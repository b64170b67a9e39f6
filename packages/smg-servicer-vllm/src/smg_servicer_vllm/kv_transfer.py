"""vLLM's KV-transfer connector as a prefill/decode worker reports and serves it, pure.

- The connector ``GetServerInfo`` reports (:func:`reported_connector`): the router picks its PD
  pairing protocol by that name (``MooncakeConnector``: bootstrap metadata; ``NixlConnector``:
  ``kv_transfer_params`` relayed; anything else: relayed opportunistically). A ``MultiConnector``
  is reported by the child that moves the KV between workers (the first Mooncake or NIXL
  connector at any depth), else as itself.
- The rejection notice (:func:`owes_rejection_notice`): a decode request whose
  ``kv_transfer_params`` ask for a remote prefill pins the prefill worker's blocks until the
  connector hears the request finished. One that fails before reaching the engine never does, so
  the engine is told (``AsyncLLM.notify_kv_transfer_request_rejected``, vLLM 0.21+), as vLLM's own
  HTTP server does. Withheld whenever Mooncake is among the connectors (at any depth of a
  ``MultiConnector``): vLLM 0.31's ``MooncakeConnector`` reports the notice's empty pull as a
  finished transfer for a request the scheduler no longer tracks, which kills the decode engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MOONCAKE = "MooncakeConnector"
NIXL = "NixlConnector"
MULTI = "MultiConnector"
#: Connectors that move KV between a prefill and a decode worker (the router's pairing modes).
TRANSFER = (MOONCAKE, NIXL)
#: How deep MultiConnectors may nest (an operator's configuration; deeper is not read).
MAX_DEPTH = 8


def _field(config: Any, name: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(name)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return getattr(config, name, None)


def connectors(config: Any, depth: int = 0) -> list[str]:
    """Every connector a ``kv_transfer_config`` names, depth first: a ``MultiConnector``, then
    its children (``kv_connector_extra_config["connectors"]``, dicts or configs)."""
    if config is None or depth > MAX_DEPTH:
        return []
    name = str(_field(config, "kv_connector") or "")
    if not name:
        return []
    found = [name]
    if name == MULTI:
        extra: Any = _field(config, "kv_connector_extra_config") or {}
        children: Any = _field(extra, "connectors") or []
        if isinstance(children, list | tuple):
            for child in children:  # pyright: ignore[reportUnknownVariableType]
                found += connectors(child, depth + 1)
    return found


def reported_connector(config: Any) -> str:
    """The connector to report: the configured one, or a ``MultiConnector``'s KV mover."""
    names = connectors(config)
    if not names:
        return ""
    if names[0] != MULTI:
        return names[0]
    return next((name for name in names if name in TRANSFER), names[0])


def runs_mooncake(config: Any) -> bool:
    return MOONCAKE in connectors(config)


def owes_rejection_notice(config: Any, kv_transfer_params: Mapping[str, Any] | None) -> bool:
    """A request with these ``kv_transfer_params`` that fails before reaching the engine must be
    reported to the connector: a connector is configured (not Mooncake) and the request asks
    for a remote prefill."""
    if not kv_transfer_params or not kv_transfer_params.get("do_remote_prefill"):
        return False
    names = connectors(config)
    return bool(names) and MOONCAKE not in names

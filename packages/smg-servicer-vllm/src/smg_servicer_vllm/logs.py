"""Route our packages' log records through vLLM's handlers.

vLLM's launcher configures only the ``vllm`` logger; without this, the servicer's INFO lines
(start-up settings, KV-event subscriptions) would go nowhere. Called once the launcher has built
the engine, when vLLM's handlers exist. A logger that already has handlers (configured by the
user) is left alone.
"""

from __future__ import annotations

import logging

PACKAGES = ("smg_servicer_vllm", "smg_servicer_core", "smg_servicer_kv_bridge")


def route_through_vllm() -> None:
    source = logging.getLogger("vllm")
    if not source.handlers:
        return
    for name in PACKAGES:
        target = logging.getLogger(name)
        if target.handlers:
            continue
        for handler in source.handlers:
            target.addHandler(handler)
        target.setLevel(source.getEffectiveLevel())
        target.propagate = False

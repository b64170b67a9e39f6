"""SMG gRPC servicer for vLLM: ``vllm.grpc.engine.VllmEngine`` over an in-process ``AsyncLLM``.

``VllmEngineServicer``, ``VllmHealthServicer`` and ``MmSettings`` are resolved lazily, so importing
this package imports no vLLM (the servicer modules do).
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "VllmEngineServicer": "smg_servicer_vllm.servicer",
    "VllmHealthServicer": "smg_servicer_vllm.health_servicer",
    "MmSettings": "smg_servicer_vllm.mm_settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

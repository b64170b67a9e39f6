"""``smg_grpc_servicer.vllm``: what ``vllm serve MODEL --grpc`` imports, from smg-servicer-vllm.

``VllmEngineServicer(async_llm, start_time, mm_settings=None)`` and
``VllmHealthServicer(async_llm)`` are resolved lazily, so importing this package imports no engine.
"""

from typing import Any

from smg_grpc_servicer._delegate import load

_LAZY_NAMES = ("VllmEngineServicer", "VllmHealthServicer")


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        return getattr(load("vllm"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_NAMES])

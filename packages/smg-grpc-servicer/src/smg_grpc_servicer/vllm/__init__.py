"""``smg_grpc_servicer.vllm``: what ``vllm serve MODEL --grpc`` imports, from smg-servicer-vllm.

``VllmEngineServicer(async_llm, start_time, mm_settings=None)``, ``VllmHealthServicer(async_llm)``
and ``MmSettings`` (what a launcher passes as ``mm_settings``) are resolved lazily, so importing
this package imports no engine. ``smg_grpc_servicer.vllm.plugin.register`` is the vLLM general
plugin (registered by smg-servicer-vllm as ``vllm.general_plugins: smg-servicer``).
"""

from typing import Any

from smg_grpc_servicer._delegate import load

_LAZY_NAMES = ("VllmEngineServicer", "VllmHealthServicer", "MmSettings")


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        return getattr(load("vllm"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_NAMES])

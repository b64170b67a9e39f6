"""Resolve a facade path to the engine package that implements it."""

from __future__ import annotations

import importlib
from types import ModuleType

#: facade engine name -> (distribution, import package, extra that brings the engine)
ENGINE_PACKAGES: dict[str, tuple[str, str, str]] = {
    "vllm": ("smg-servicer-vllm", "smg_servicer_vllm", "vllm"),
    "sglang": ("smg-servicer-sglang", "smg_servicer_sglang", "sglang"),
    "mlx": ("smg-servicer-mlx", "smg_servicer_mlx", "mlx"),
    "tokenspeed": ("smg-servicer-tokenspeed", "smg_servicer_tokenspeed", "tokenspeed"),
    # The multimodal sidecar of vLLM workers (smg_grpc_servicer.vllm.mm_sidecar): vLLM's
    # processing, so the vLLM package's (smg_servicer_vllm.mm_sidecar) with the Redis client.
    "mm_sidecar": ("smg-servicer-vllm", "smg_servicer_vllm", "vllm,redis"),
}


def install_hint(engine: str) -> str:
    dist, _, extra = ENGINE_PACKAGES[engine]
    return f"pip install '{dist}[{extra}]'"


def load(engine: str, submodule: str = "") -> ModuleType:
    """Import ``<engine package>[.submodule]``; a missing package raises a helpful ImportError.

    Errors raised *inside* the engine package (its engine missing, say) pass through unchanged:
    they name their own extra.
    """
    dist, package, _ = ENGINE_PACKAGES[engine]
    target = f"{package}.{submodule}" if submodule else package
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        if err.name not in (package, target):
            raise
        raise ImportError(
            f"smg_grpc_servicer.{engine} is provided by {dist}, which is not installed: "
            f"{install_hint(engine)}",
            name=package,
        ) from err

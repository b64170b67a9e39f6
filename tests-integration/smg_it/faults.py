"""Faults injected into real worker processes at the engine boundary."""

from __future__ import annotations

from pathlib import Path

from smg_servicer_core.config import environment

HANG_DIR = Path(__file__).parent / "hang"

#: engine -> the call its worker makes to stop the engine's processes (or the engine itself):
#: made to hang, the worker's shutdown never ends unless the servicer's deadline cuts it.
ENGINE_SHUTDOWN = {
    "mlx": "smg_servicer_mlx._engine:MlxEngine.shutdown",
    "vllm": "vllm.v1.engine.async_llm:AsyncLLM.shutdown",
    "sglang": "smg_servicer_sglang._sglang:terminate",
    "tokenspeed": "smg_servicer_tokenspeed.server:stop_ranks",
}


def hang_env(target: str) -> dict[str, str]:
    """The environment that makes ``target`` (``module:Attr.path``) hang forever in a worker
    (:mod:`smg_it.hang.sitecustomize`)."""
    path = [str(HANG_DIR), environment().get("PYTHONPATH", "")]
    return {"PYTHONPATH": ":".join(p for p in path if p), "SMG_TEST_HANG": target}

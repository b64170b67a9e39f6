"""Test doubles and helpers shipped with core, so engine packages and outside users test alike.

- :class:`FakeEngine` / :class:`FakeScript` — a scriptable engine boundary (delays, faults, aborts);
- :class:`FakeEngineServicer` — a full servicer over the fake engine (MLX wire);
- :func:`running_server` — an in-process server on port 0 through the real ``serve()`` lifecycle;
- :func:`generate_request` — proto request builders per wire;
- :func:`make_tiny_model` / :func:`cached_tiny_model` — float32 tiny Llama/Qwen2 + tokenizer
  (needs the ``testing`` extra: numpy, tokenizers).
"""

from smg_servicer_core.testing.fake_engine import EngineFault, FakeEngine, FakeOutput, FakeScript
from smg_servicer_core.testing.fake_servicer import FakeEngineServicer
from smg_servicer_core.testing.requests import generate_request, mlx_generate, next_request_id
from smg_servicer_core.testing.server import RunningServer, running_server
from smg_servicer_core.testing.tiny_model import TinyModelSpec, cached_tiny_model, make_tiny_model

__all__ = [
    "EngineFault",
    "FakeEngine",
    "FakeEngineServicer",
    "FakeOutput",
    "FakeScript",
    "RunningServer",
    "TinyModelSpec",
    "cached_tiny_model",
    "generate_request",
    "make_tiny_model",
    "mlx_generate",
    "next_request_id",
    "running_server",
]

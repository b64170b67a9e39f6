"""Test-environment shim: ``pin_memory`` is a no-op on a machine without an accelerator.

Why: SGLang 0.5.23 asks for pinned host memory unconditionally in two paths that the tests run
on this CPU: its LoRA layers and backends (``lora/layers.py``, ``lora/backend/torch_backend.py``:
``torch.empty(..., pin_memory=True)``, ``tensor.pin_memory()``), and the prefill/decode KV
transfer. torch's CPU build refuses both (``RuntimeError: pin_memory=True requires a CUDA or other
accelerator backend``), so ``--enable-lora`` dies at start and a prefill worker dies on its first
KV chunk. Pinned memory only speeds up host-to-device copies; on a CPU-only machine there is no
device, so dropping the request changes no result.

The same prefill/decode path also fences the pinned copy with a CUDA event: with the Mooncake
sender (``supports_host_tensor_indices``) ``prefill.py`` ``send_kv_chunk`` does
``torch.cuda.Event().record(torch.cuda.current_stream())`` and the transfer thread calls
``.synchronize()`` on it; torch's CPU build fails at ``torch.cuda.Event()`` ("Tried to
instantiate dummy base class Event") and at ``torch.cuda.current_stream()`` ("Torch not compiled
with CUDA enabled"). On CPU every copy is synchronous, so there is nothing to wait for: the shim
points ``torch.cuda.Event`` and ``torch.cuda.current_stream`` at torch's own device-agnostic
no-ops, ``torch.cpu.Event`` (record/synchronize/query/wait do nothing, ``query()`` is True) and
``torch.cpu.current_stream``.

What it does, in a process started with ``SMG_CPU_PIN_MEMORY_SHIM=1`` (children inherit it):
once ``torch`` is imported, and only when torch reports no accelerator, the tensor factories drop
``pin_memory=True``, ``Tensor.pin_memory()`` returns the tensor itself, and ``torch.cuda.Event``
and ``torch.cuda.current_stream`` become ``torch.cpu.Event`` and ``torch.cpu.current_stream``. It
imports nothing before ``torch`` is imported by someone else. Without the variable SGLang's own
failure stays (the tests that pin it start their workers without it).

When it stops being needed: once SGLang checks ``is_pin_memory_available()`` on those paths (it
already does in ``lora/mem_pool.py``), or torch's CPU build accepts the flag, and SGLang takes the
KV-index event from its device module (``torch.get_device_module()``) instead of ``torch.cuda``
(the event part alone could go then). Installed by
``install.sh`` through a ``.pth`` file in the SGLang test environments only.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from import_hook import after_import

#: The variable that turns the shim on.
ENV = "SMG_CPU_PIN_MEMORY_SHIM"

#: The factories SGLang calls with ``pin_memory=True``.
FACTORIES = (
    "empty", "zeros", "ones", "full", "tensor", "arange", "as_tensor",
    "empty_like", "zeros_like", "ones_like", "full_like", "empty_strided",
)  # fmt: skip


def _unpinned(factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return call


def patch(torch: Any) -> bool:
    """Patch ``torch`` when it has no accelerator; True when it did (idempotent)."""
    if getattr(torch, "_smg_pin_memory_shim", False):
        return True
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return False
    for name in FACTORIES:
        factory = getattr(torch, name, None)
        if factory is not None:
            setattr(torch, name, _unpinned(factory))
    torch.Tensor.pin_memory = lambda self, *_a, **_k: self
    torch.Tensor.is_pinned = lambda self, *_a, **_k: False
    # CPU copies are synchronous: the event fence of the KV transfer has nothing to wait for.
    torch.cuda.Event = torch.cpu.Event
    torch.cuda.current_stream = torch.cpu.current_stream
    torch._smg_pin_memory_shim = True
    return True


def install() -> None:
    """Active in processes started with ``SMG_CPU_PIN_MEMORY_SHIM=1`` (their children inherit
    it): the tests that need pinned memory ask for it, the others keep SGLang's own failure."""
    if os.environ.get(ENV) == "1":
        after_import("torch", patch)

"""Test-environment shim: the ``torch.ops.sgl_kernel`` names SGLang's Qwen3.5 module binds.

Why: SGLang 0.5.23's Qwen-VL multimodal processor (``multimodal/processors/qwen_vl.py``) imports
every Qwen-family model module, and ``models/qwen3_5.py`` (also ``muse_glimmer.py``) binds CPU
kernels of sgl-kernel's CPU build at import (``torch.ops.sgl_kernel.fused_sigmoid_mul_cpu`` and
three more) when SGLang runs on a CPU. That build ships no wheel (see ``sgl_kernel/``), so the
lookup raises ``AttributeError`` and no Qwen-VL model, Qwen2-VL included, can be served: the
processor never imports. Qwen2-VL calls none of these kernels.

What it does: once ``torch`` is imported (``import_hook.after_import``), each missing name on
``torch.ops.sgl_kernel`` is given a Python function: ``fused_sigmoid_mul_cpu(x, gate)`` does what
the kernel does (``x *= sigmoid(gate)``, in place), the others raise ``NotImplementedError`` naming
the kernel if anything calls them (only Qwen3.5-family models would). Names the namespace already
has are left alone.

When it stops being needed: once a CPU build of sgl-kernel installs from an index we use, or
SGLang binds these kernels lazily. Installed by ``install.sh`` through a ``.pth`` file in the
SGLang test environments only.
"""

from __future__ import annotations

import types
from typing import Any

from import_hook import after_import

#: Bound at import by ``models/qwen3_5.py`` / ``muse_glimmer.py`` on a CPU.
RAISING = (
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
)


def _fused_sigmoid_mul_cpu(x: Any, gate: Any) -> None:
    x.mul_(gate.sigmoid())


def _raising(name: str) -> Any:
    def kernel(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(f"torch.ops.sgl_kernel.{name}: no CPU build of sgl-kernel")

    kernel.__name__ = name
    return kernel


def _define(torch: types.ModuleType) -> None:
    namespace: Any = torch.ops.sgl_kernel
    kernels: dict[str, Any] = {"fused_sigmoid_mul_cpu": _fused_sigmoid_mul_cpu}
    kernels.update({name: _raising(name) for name in RAISING})
    for name, kernel in kernels.items():
        try:
            getattr(namespace, name)
        except (AttributeError, RuntimeError):
            setattr(namespace, name, kernel)


def install() -> None:
    after_import("torch", _define)

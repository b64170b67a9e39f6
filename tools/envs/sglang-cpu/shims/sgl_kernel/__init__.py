"""Test-environment shim: ``sgl_kernel`` for a CPU host without SGLang's CPU kernel build.

Why: SGLang imports names from ``sgl_kernel`` at module level (``from sgl_kernel import X``), but
the only wheels on PyPI (``sglang-kernel``) are CUDA builds that fail to load without
``libcuda.so.1``, and the CPU build (``sgl-kernel/pyproject_cpu.toml``) ships no wheel or sdist.
On a CPU without AMX, SGLang's ``CustomOp``s take their ``forward_native`` paths, so none of the
kernels is ever called: every name resolves here to a function that raises if it is called, which
would surface as a clear ``NotImplementedError`` naming the op.

When it stops being needed: once a CPU build of sgl-kernel installs from an index we use, or on an
AMX host (Sapphire Rapids or later) where SGLang calls the CPU kernels for real and this shim must
not be used at all.
"""

__version__ = "0.4.10"


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name}: no CPU build of sgl-kernel is installed")

    missing.__name__ = name
    return missing

"""CPU stand-in for ``tokenspeed_kernel`` (TokenSpeed's CUDA/NPU kernel package).

Why: the real package raises at import on a machine without an NVIDIA, AMD or Ascend device, and
TokenSpeed 0.1.1 imports it from modules every front-end import reaches (``runtime.utils.common``
reads ``platform.current_platform``, ``server_args`` reads
``ops.attention.gdn.triton.CHUNK_SIZE``, ``metrics.collector`` writes ``CompileStats | None``,
``plugins`` calls ``discover_plugins()``). Nothing on the front-end path launches a kernel.

What: every ``tokenspeed_kernel.<a>.<b>`` imports (a meta-path finder); a capitalised attribute
is an empty class (so type unions evaluate), ``CHUNK_SIZE`` is 64, anything else is a callable
that raises ``NotImplementedError`` naming itself, so a kernel call on this path fails loudly.

When it goes away: with a ``tokenspeed_kernel`` that imports on a CPU, or on a GPU machine (the
GPU check installs the real one: tools/gpu/tokenspeed_check.sh).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

_REAL_SUBMODULES = {f"{__name__}.platform", f"{__name__}.plugins"}
_CONSTANTS = {"CHUNK_SIZE": 64}


class KernelUnavailable:
    """A kernel entry point: attribute access works, a call raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self._name} is a CPU stub (no kernels on this machine)")

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return KernelUnavailable(f"{self._name}.{item}")

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<tokenspeed_kernel CPU stub {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        if item in _CONSTANTS:
            return _CONSTANTS[item]
        if item[:1].isupper() and not item.isupper():
            value: Any = type(item, (), {"__module__": self.__name__})
        else:
            value = KernelUnavailable(f"{self.__name__}.{item}")
        setattr(self, item, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith(f"{__name__}.") and fullname not in _REAL_SUBMODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Finder())

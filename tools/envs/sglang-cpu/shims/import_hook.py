"""``after_import(name, patch)``: run ``patch(module)`` right after ``name`` is first imported.

The test environments' shims change an engine module once it exists, without importing it
themselves (which would cost every interpreter of the environment an engine import): a finder
ahead of the others wraps the module's loader. Used by ``pin_memory_shim`` (``torch``) and by the
test kit's fault injection (``tests-integration/smg_it/kv_skip``), which runs in these
environments' workers. A module already imported is patched at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

Patch = Callable[[types.ModuleType], object]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Patch) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, patch: Patch) -> None:
        self.name = name
        self.patch = patch

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.patch)
                return spec
        return None


def after_import(name: str, patch: Patch) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
        return
    if not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, patch))

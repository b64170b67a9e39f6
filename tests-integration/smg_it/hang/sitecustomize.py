"""Fault injection for shutdown tests, loaded only where :func:`smg_it.faults.hang_env` puts
this folder on ``PYTHONPATH``: ``SMG_TEST_HANG=module:Attr.path`` makes that callable (a function
or a coroutine function) block forever, in every process that imports ``module`` — an engine
whose shutdown never returns. The first call prints one line to stderr."""

from __future__ import annotations

import asyncio
import importlib.abc
import inspect
import os
import sys
import threading
from typing import Any

_TARGET = os.environ.get("SMG_TEST_HANG", "")


def _hang_like(original: Any, what: str) -> Any:
    def announce() -> None:
        print(f"smg-test-hang: {what} called; it never returns", file=sys.stderr, flush=True)

    if inspect.iscoroutinefunction(original):

        async def hang_async(*_args: Any, **_kwargs: Any) -> Any:
            announce()
            await asyncio.Event().wait()

        return hang_async

    def hang(*_args: Any, **_kwargs: Any) -> Any:
        announce()
        threading.Event().wait()

    return hang


def _patch(module: Any, path: str) -> None:
    *owners, name = path.split(".")
    owner = module
    for part in owners:
        owner = getattr(owner, part)
    setattr(owner, name, _hang_like(getattr(owner, name), f"{module.__name__}:{path}"))


class _Patcher(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, path: str) -> None:
        self.module, self.path = module, path

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        if loader is None:
            return None
        original = loader.exec_module
        attr = self.path

        def exec_module(module: Any) -> None:
            original(module)
            _patch(module, attr)

        loader.exec_module = exec_module
        return spec


if _TARGET:
    _module, _, _path = _TARGET.partition(":")
    if _module in sys.modules:
        _patch(sys.modules[_module], _path)
    else:
        sys.meta_path.insert(0, _Patcher(_module, _path))

"""Fault injection at the engine boundary for the prefill/decode tests: on a prefill worker
started with this folder on ``PYTHONPATH`` and ``SMG_PD_SKIP_KV_FILE=<path>``, SGLang's Mooncake
KV copy is skipped (and reported done) while ``<path>`` exists. The decode worker then attends over
KV slots it never received: what it generates after the first token (which the prefill worker
sends beside the KV) changes. With the file absent the copy runs as usual.

``tests-integration/test_disaggregation.py`` uses it to show that a decode worker continues the
prefilled prompt from the transferred KV, not from a local recompute.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

TARGET = "sglang.srt.disaggregation.mooncake.conn"
FLAG = os.environ.get("SMG_PD_SKIP_KV_FILE", "")


def _patch(module: types.ModuleType) -> None:
    manager: Any = module.MooncakeKVManager
    copy = manager._send_kvcache_generic

    def send(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(FLAG):
            print("smg-kv-skip: KV copy skipped", file=sys.stderr, flush=True)
            return 0  # Mooncake's "transferred" status
        return copy(self, *args, **kwargs)

    manager._send_kvcache_generic = send


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


if FLAG:
    sys.meta_path.insert(0, _Finder())

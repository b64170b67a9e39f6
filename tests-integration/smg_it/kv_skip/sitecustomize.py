"""Fault injection at the engine boundary for the prefill/decode tests: on a prefill worker
started with this folder on ``PYTHONPATH`` and ``SMG_PD_SKIP_KV_FILE=<path>``, SGLang's Mooncake
KV copy is skipped (and reported done) while ``<path>`` exists. The decode worker then attends over
KV slots it never received: what it generates after the first token (which the prefill worker
sends beside the KV) changes. With the file absent the copy runs as usual.

``tests-integration/test_disaggregation.py`` uses it to show that a decode worker continues the
prefilled prompt from the transferred KV, not from a local recompute.
"""

from __future__ import annotations

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


if FLAG:
    # The SGLang test environments put their shims folder (and its import hook) on the path.
    from import_hook import after_import  # pyright: ignore[reportMissingImports]

    after_import(TARGET, _patch)

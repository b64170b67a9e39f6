"""``Abort``, ``HealthCheck`` and ``GetTokenizer``: the RPCs that read the same on every wire.

A servicer mixes :class:`CommonRpcs` in before its generated base class and provides ``wire`` (the
generated ``*_pb2`` module, for the response types), ``registry``, ``bundles``, ``health``,
:meth:`CommonRpcs.not_ready_reason` and :meth:`CommonRpcs.tokenizer_dir`.

``HealthCheck`` always answers OK with ``healthy`` true or false: the router detects the engine
by the status of this call, and a non-OK status would fail detection instead of marking the worker
not ready.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc.aio

from smg_servicer_core.errors import grpc_errors
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.registry import RequestRegistry
from smg_servicer_core.tokenizer_bundle import TokenizerBundleCache

Context = grpc.aio.ServicerContext[Any, Any]


class CommonRpcs(ABC):
    wire: ModuleType
    registry: RequestRegistry
    bundles: TokenizerBundleCache
    health: HealthFrame

    @abstractmethod
    def not_ready_reason(self) -> str | None:
        """None when the engine takes requests, else a short reason for ``HealthCheck``."""

    @abstractmethod
    def tokenizer_dir(self) -> str | Path | None:
        """The directory ``GetTokenizer`` bundles (None: not configured)."""

    @grpc_errors
    async def Abort(self, request: Any, context: Context) -> Any:
        await self.registry.abort_many(list(request.request_ids))
        return self.wire.AbortResponse()

    @grpc_errors
    async def HealthCheck(self, request: Any, context: Context) -> Any:
        reason = "shutting down" if self.health.shutting_down else self.not_ready_reason()
        return self.wire.HealthCheckResponse(healthy=reason is None, message=reason or "OK")

    @grpc_errors
    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: Context
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        for chunk in await self.bundles.stream(self.tokenizer_dir()):
            yield chunk

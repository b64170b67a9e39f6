"""``EngineServicer``: the skeleton every engine servicer is built on.

An engine package writes::

    class MyServicer(EngineServicer, my_engine_pb2_grpc.MyEngineServicer):
        wire = my_engine_pb2              # the generated messages
        wire_grpc = my_engine_pb2_grpc    # add_MyEngineServicer_to_server
        service = "MyEngine"              # the service's name in the wire

        def __init__(self, engine, **kw):
            self.engine = engine
            super().__init__(**kw)        # health, registry, bundles, metrics, clocks

        async def engine_abort(self, request_id): ...     # stop one request in the engine
        def model_facts(self) -> ModelFacts: ...          # GetModelInfo and the validators
        async def probe(self) -> str | None: ...          # health: None = healthy
        def tokenizer_dir(self): ...                      # GetTokenizer

and gets ``binding()`` (for :func:`~smg_servicer_core.server.serve`), ``Abort``,
``HealthCheck``, ``GetTokenizer`` and ``GetModelInfo``. ``Generate`` stays the engine's own, as a
recipe: validate (:mod:`.validate`) -> convert (pure) -> ``async with self.registry.track(rid)``
around the engine's stream -> convert back.

``HealthCheck`` always answers OK with ``healthy`` true or false (the reason in ``message``): the
router detects the engine by the status of this call, and a non-OK status would fail detection
instead of marking the worker not ready. It reports the same state as ``grpc.health.v1``
(:class:`~smg_servicer_core.health.HealthFrame`, driven by :meth:`EngineServicer.probe`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import grpc.aio

from smg_servicer_core.errors import grpc_errors, quiet_gone_clients
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import LoadsSource, ServicerMetrics
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.registry import RequestRegistry
from smg_servicer_core.server import ServiceBinding, bind_servicer
from smg_servicer_core.tokenizer_bundle import TokenizerBundleCache
from smg_servicer_core.tracing import Tracing

Context = grpc.aio.ServicerContext[Any, Any]


class EngineServicer(ABC):
    wire: ClassVar[ModuleType]
    wire_grpc: ClassVar[ModuleType]
    service: ClassVar[str]

    def __init__(
        self, *, health: HealthFrame | None = None, metrics: ServicerMetrics | None = None
    ) -> None:
        quiet_gone_clients()  # grpc.aio's traceback for a client gone mid-send: one DEBUG line
        self.health = health if health is not None else HealthFrame(self.service_name())
        if self.health.probe is None:
            self.health.probe = self.probe
        self.registry = RequestRegistry(
            self.engine_abort, shutting_down=lambda: self.health.shutting_down
        )
        self.bundles = TokenizerBundleCache()
        self.metrics: ServicerMetrics | None = None
        #: Request spans (:mod:`.tracing`), when tracing is on: :meth:`attach_tracing`.
        self.tracing: Tracing | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        if metrics is not None:
            self.attach_metrics(metrics)

    @classmethod
    def service_name(cls) -> str:
        return str(cls.wire.DESCRIPTOR.services_by_name[cls.service].full_name)

    def binding(self) -> ServiceBinding:
        add = getattr(self.wire_grpc, f"add_{self.service}Servicer_to_server")
        return bind_servicer(self.service_name(), add, self)

    def attach_metrics(self, metrics: ServicerMetrics) -> None:
        """Report every RPC, stream and abort of this servicer to ``metrics``."""
        self.metrics = metrics
        self.registry.on_stop = metrics.abort
        metrics.loads_source = self.engine_loads()

    def attach_tracing(self, tracing: Tracing | None) -> None:
        """Give every ``Generate`` that carries the caller's trace context a span
        (:mod:`smg_servicer_core.tracing`); None: none."""
        self.tracing = tracing

    def engine_loads(self) -> LoadsSource | None:
        """What ``/metrics`` shows as the engine's load (None: the engine reports none)."""
        return None

    def uptime_s(self) -> float:
        return time.monotonic() - self.started

    # -- what an engine provides -----------------------------------------------------------

    @abstractmethod
    async def engine_abort(self, request_id: str) -> None:
        """Stop ``request_id`` in the engine (called at most once per request)."""

    @abstractmethod
    def model_facts(self) -> ModelFacts:
        """The model's facts (``GetModelInfo``, validator limits)."""

    @abstractmethod
    def tokenizer_dir(self) -> str | Path | None:
        """The directory ``GetTokenizer`` bundles (None: not configured)."""

    async def probe(self) -> str | None:
        """The engine's health: None when it takes requests, else a short reason."""
        return None

    # -- the RPCs that read the same on every wire -----------------------------------------

    @grpc_errors
    async def Abort(self, request: Any, context: Context) -> Any:
        await self.registry.abort_many(list(request.request_ids))
        return self.wire.AbortResponse()

    @grpc_errors
    async def HealthCheck(self, request: Any, context: Context) -> Any:
        reason = await self.health.reason()
        return self.wire.HealthCheckResponse(healthy=reason is None, message=reason or "OK")

    @grpc_errors
    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: Context
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        for chunk in await self.bundles.stream(self.tokenizer_dir()):
            yield chunk

    @grpc_errors
    async def GetModelInfo(self, request: Any, context: Context) -> Any:
        return self.model_facts().to_proto(self.wire.GetModelInfoResponse)

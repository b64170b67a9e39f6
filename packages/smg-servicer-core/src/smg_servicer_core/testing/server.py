"""An in-process server on 127.0.0.1, port 0, driven through the real :func:`serve` lifecycle.

    async with running_server([servicer.binding()], health, engine) as srv:
        stub = MlxEngineStub(srv.channel)
        ...
        await srv.stop()          # same path as SIGTERM: drain, engine shutdown, exit code

The exit code ``serve()`` returned is ``srv.exit_code`` after the block (or after ``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

import grpc.aio

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.metrics import MetricsServer
from smg_servicer_core.server import EngineLifecycle, ServerOptions, ServiceBinding, serve

START_TIMEOUT_S = 10.0


@dataclass
class RunningServer:
    port: int
    channel: grpc.aio.Channel
    stop_event: asyncio.Event
    task: asyncio.Task[int]
    exit_code: int | None = field(default=None)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, timeout_s: float = 30.0) -> int:
        """Request a graceful stop (as SIGTERM does) and wait for ``serve()`` to return."""
        self.stop_event.set()
        code = await asyncio.wait_for(asyncio.shield(self.task), timeout_s)
        self.exit_code = code
        return code


@contextlib.asynccontextmanager
async def running_server(
    bindings: Sequence[ServiceBinding],
    health: HealthFrame,
    engine: EngineLifecycle,
    *,
    grace_period_s: float = 5.0,
    in_flight: Callable[[], int] | None = None,
    metrics_server: MetricsServer | None = None,
) -> AsyncGenerator[RunningServer]:
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    options = ServerOptions(host="127.0.0.1", port=0, grace_period_s=grace_period_s)
    task = asyncio.create_task(
        serve(
            bindings,
            health,
            engine,
            options,
            stop_event=stop,
            handle_signals=False,
            on_started=bound.set_result,
            in_flight=in_flight,
            metrics_server=metrics_server,
        )
    )
    done, _ = await asyncio.wait(
        {bound, task}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    if bound not in done:
        task.cancel()
        if task in done:
            task.result()  # re-raise the start-up error
        raise TimeoutError("in-process server did not start")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound.result()}")
    server = RunningServer(port=bound.result(), channel=channel, stop_event=stop, task=task)
    try:
        yield server
    finally:
        await channel.close()
        if not task.done():
            await server.stop()
        elif server.exit_code is None:
            server.exit_code = task.result()

"""``serve_grpc(server_args, model_info=None, on_request_manager_ready=None)``: what
``sglang serve --smg-grpc-mode`` calls (through ``smg_grpc_servicer.sglang.server``).

The servicer process takes the tokenizer manager's role:

1. validate and publish ``server_args`` (as SGLang's own launcher does), bind the scheduler
   sockets, start every scheduler rank this node runs and wait until all are ready;
2. call ``on_request_manager_ready(request_manager, server_args, scheduler_info)`` (SGLang starts
   its HTTP sidecar there);
3. serve ``SglangScheduler`` + ``grpc.health.v1`` + reflection; NOT_SERVING until a warm-up
   request went through (``--skip-server-warmup`` or ``SMG_SGLANG_SERVICER_WARMUP=off`` skip it);
4. the engine service turns NOT_SERVING while the scheduler is silent for 30 s with requests
   pending, and back when it answers;
5. SIGTERM/SIGINT: NOT_SERVING, drain in-flight calls (sockets still open), fail what is left,
   stop the schedulers (SIGTERM, 2 s, SIGKILL), exit 0;
6. a scheduler that exits (or signals a failure with SIGQUIT) ends the server with exit 1 within
   about a second; a scheduler that cannot start gives exit 1, an invalid configuration exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from smg_servicer_core.errors import ConfigError
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.server import DEFAULT_GRACE_PERIOD_S, ServerOptions, serve
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang import convert, kv_events
from smg_servicer_sglang.request_manager import RequestManager
from smg_servicer_sglang.servicer import SERVICE_NAME, SglangServicer

logger = logging.getLogger(__name__)

WARMUP_ENV = "SMG_SGLANG_SERVICER_WARMUP"
_WARMUP_OFF = frozenset({"off", "0", "false", "no", "none"})
WARMUP_TIMEOUT_S = 300.0
WATCH_INTERVAL_S = 1.0
SCHEDULER_STOP_S = 2.0

ReadyCallback = Callable[[Any, Any, dict[str, Any]], Awaitable[None]]


def warmup_wanted(config: Any, environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if getattr(config, "skip_server_warmup", False):
        return False
    return env.get(WARMUP_ENV, "on").strip().lower() not in _WARMUP_OFF


def warmup_ids(vocab_size: int, count: int = 7) -> list[int]:
    """Distinct prompt ids inside the vocabulary, however small it is."""
    return [(97 * k) % vocab_size for k in range(1, count + 1)]


async def warm_up(servicer: SglangServicer) -> None:
    """One greedy 8-token generate (or one embed) through the scheduler; raises if it fails."""
    ids = warmup_ids(servicer.limits.vocab_size)
    tokenized = pb.TokenizedInput(input_ids=ids)
    if not servicer.limits.is_generation:
        req = convert.embed_req(
            pb.EmbedRequest(request_id="WARMUP_embed", tokenized=tokenized),
            servicer.limits,
            servicer.tokenizer,
        )
        servicer.manager.open([req.rid])
        try:
            await servicer.manager.send(req)
            async for batch in servicer.manager.stream(req.rid):
                if (error := convert.failure(batch[-1].finish)) is not None:
                    raise error
        finally:
            servicer.manager.close_states([req.rid])
        return
    request = pb.GenerateRequest(
        request_id="WARMUP_generate",
        tokenized=tokenized,
        sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=8),
    )
    reqs, _ = convert.generate_reqs(request, servicer.limits, servicer.tokenizer)
    async for _ in servicer._single(request, reqs[0]):  # pyright: ignore[reportPrivateUsage]
        pass


class Schedulers:
    """The scheduler ranks' lifecycle for ``core.server.serve``."""

    def __init__(
        self, launched: sg.Launched, manager: RequestManager, servicer: SglangServicer,
        health: HealthFrame, warmup: bool,
    ) -> None:  # fmt: skip
        self.launched = launched
        self.manager = manager
        self.servicer = servicer
        self.health = health
        self.warmup = warmup
        self.quit_reason: str | None = None
        self._stalled = False
        servicer.dead_reason = self.dead_reason

    def on_sigquit(self) -> None:
        self.quit_reason = "a scheduler process reported a fatal error (SIGQUIT)"

    def dead_reason(self) -> str | None:
        if self.quit_reason is not None:
            return self.quit_reason
        return self.launched.dead() or self.manager.failed

    async def wait_ready(self) -> None:
        if not self.warmup:
            logger.info("warm-up skipped")
            return
        await asyncio.wait_for(warm_up(self.servicer), WARMUP_TIMEOUT_S)
        logger.info("warm-up request done")

    async def wait_dead(self) -> str:
        while True:
            reason = self.dead_reason()
            if reason is not None:
                return reason
            self._watch_stall()
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _watch_stall(self) -> None:
        stalled = self.manager.stalled
        if stalled != self._stalled:
            self._stalled = stalled
            if stalled:
                logger.warning(
                    "scheduler silent for %.0fs with %d request(s) pending: NOT_SERVING",
                    self.manager.stalled_for(),
                    self.manager.active,
                )
            else:
                logger.info("scheduler answering again: SERVING")
        self.health.set_engine_serving(not stalled)

    async def shutdown(self) -> None:
        await self.manager.close()
        await asyncio.to_thread(
            sg.terminate, self.launched.processes, SCHEDULER_STOP_S, self.launched.pids
        )
        reader = self.launched.load_reader
        if reader is not None:
            reader.close()
        logger.info("schedulers stopped")


class _QuitSignal:
    """SIGQUIT from a scheduler (its "I failed" signal) at any point of the process's life."""

    def __init__(self) -> None:
        self.seen = False
        self.target: Schedulers | None = None

    def __call__(self) -> None:
        self.seen = True
        if self.target is not None:
            self.target.on_sigquit()


async def _start(server_args: Any, quit_signal: _QuitSignal) -> Schedulers | int:
    """Everything up to serving: the running schedulers and servicer, or an exit code."""
    try:
        kv_events.parse_config(getattr(server_args, "kv_events_config", None))
        port_args, config = sg.prepare(server_args)
    except (ConfigError, ValueError, TypeError) as exc:
        logger.error("invalid configuration: %s", exc)
        return 2
    # After prepare(): SGLang's launch-time SIGQUIT handler kills the whole process tree; ours
    # turns a scheduler's failure into a clean stop with exit 1.
    asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, quit_signal)
    manager = RequestManager(port_args, sg.dp_size())
    try:
        launched = await asyncio.to_thread(sg.launch_schedulers, server_args, port_args)
    except sg.SchedulerStartError as exc:
        logger.error("schedulers failed to start: %s", exc)
        await manager.close()
        return 1
    manager.start()
    try:
        facts = sg.model_facts(server_args)
        tokenizer = await asyncio.to_thread(sg.load_tokenizer, config)
    except Exception:
        logger.exception("start-up failed after the schedulers started")
        await manager.close()
        await asyncio.to_thread(sg.terminate, launched.processes, SCHEDULER_STOP_S, launched.pids)
        return 1
    health = HealthFrame(SERVICE_NAME)
    servicer = SglangServicer(
        manager,
        server_args=server_args,
        config=config,
        scheduler_info=launched.scheduler_info,
        facts=facts,
        health=health,
        tokenizer=tokenizer,
        load_reader=launched.load_reader,
    )
    schedulers = Schedulers(launched, manager, servicer, health, warmup_wanted(config))
    quit_signal.target = schedulers
    if quit_signal.seen:
        schedulers.on_sigquit()
    return schedulers


async def run(
    server_args: Any,
    on_request_manager_ready: ReadyCallback | None = None,
    on_started: Callable[[int], None] | None = None,
) -> int:
    """Start, serve until a stop signal or scheduler death, stop. Returns the exit code."""
    loop = asyncio.get_running_loop()
    quit_signal = _QuitSignal()
    try:
        started = await _start(server_args, quit_signal)
        if isinstance(started, int):
            return started
        schedulers = started
        servicer = schedulers.servicer
        try:
            if on_request_manager_ready is not None:
                await on_request_manager_ready(
                    schedulers.manager, server_args, schedulers.launched.scheduler_info
                )
            options = ServerOptions(
                host=str(servicer.config.host),
                port=int(servicer.config.port),
                grace_period_s=DEFAULT_GRACE_PERIOD_S,
            )
            return await serve(
                [servicer.binding()],
                schedulers.health,
                schedulers,
                options,
                on_started=on_started,
                in_flight=lambda: len(servicer.registry),
            )
        except ConfigError as exc:  # the port cannot be bound
            logger.error("%s", exc)
            await schedulers.shutdown()
            return 2
        except Exception:
            logger.exception("server failed")
            await schedulers.shutdown()
            return 1
    finally:
        loop.remove_signal_handler(signal.SIGQUIT)


async def serve_grpc(
    server_args: Any,
    model_info: dict[str, Any] | None = None,
    on_request_manager_ready: ReadyCallback | None = None,
) -> None:
    """SGLang's entry point. ``model_info`` is accepted for the launcher's signature and unused
    (model facts come from the model's config). Exits the process with 1 or 2 on failure."""
    del model_info
    code = await run(server_args, on_request_manager_ready)
    if code != 0:
        raise SystemExit(code)

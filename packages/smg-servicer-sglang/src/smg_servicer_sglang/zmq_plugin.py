"""The ``smg-zmq`` SGLang plugin (entry point group ``sglang.srt.plugins``): SGLang's own scheduler
behind the router's direct ZMQ lane, no Python between the router and the scheduler.

SGLang loads plugins in every scheduler process before it builds the scheduler. This one does
nothing unless :data:`HANDSHAKE_ENV` is set (our headless launcher sets it,
:mod:`smg_servicer_sglang.headless`); then it hooks the seams SGLang keeps for another ingress (its
embedded Rust server uses them):

- ``SchedulerIpcChannels.create``: the rank that owns request I/O opens none of the tokenizer
  manager's sockets; both of its sender slots are one :class:`~.zmq_wire.OutputSender`;
- ``Scheduler.init_idle_sleeper``: there is nothing to sleep on until the handshake;
- ``Scheduler.maybe_init_rust_server`` (after it): the model and its KV cache are up, so the
  scheduler dials the router (:func:`~.zmq_wire.handshake`) and the router's input socket becomes
  its request source;
- ``SchedulerRequestReceiver._pull_raw_reqs``: drain that source;
- ``Scheduler.run_event_loop``: the dead-engine sentinel when the loop ends, however it ends.

SIGUSR1 (the launcher's, on SIGTERM) or a SIGTERM of its own starts a drain: new requests are
refused with 503, the ones in flight finish, then the scheduler exits 0.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from typing import Any

from smg_servicer_core.config import Setting, setting_value
from smg_servicer_sglang import zmq_wire

logger = logging.getLogger(__name__)

#: The router's handshake address (or our launcher's relay in front of it): set, the plugin acts.
HANDSHAKE_ENV = "SMG_SGLANG_ZMQ_HANDSHAKE"
#: The engine index this launch registers as (plus the scheduler's DP rank: 0 here).
ENGINE_INDEX_ENV = "SMG_SGLANG_ZMQ_ENGINE_INDEX"
HANDSHAKE = Setting(
    "zmq_handshake", str, "", "the router's ZMQ handshake the scheduler dials", env=HANDSHAKE_ENV
)
ENGINE_INDEX = Setting(
    "zmq_engine_index", int, 0, "the engine index the scheduler registers as", env=ENGINE_INDEX_ENV
)
#: The signal that starts a drain in the scheduler.
DRAIN_SIGNAL = signal.SIGUSR1

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_CHANNELS = "sglang.srt.managers.scheduler_components.ipc_channels.SchedulerIpcChannels"
_RECEIVER = "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver"


class _Lane:
    """This process's part of the lane: set on the rank that owns request I/O only."""

    sender: zmq_wire.OutputSender | None = None
    source: zmq_wire.RequestSource | None = None
    context: Any = None
    draining = False


_lane = _Lane()


def handshake_address() -> str | None:
    return setting_value(HANDSHAKE).strip() or None


def engine_index() -> int:
    return setting_value(ENGINE_INDEX)


def register() -> None:
    """The entry point: hook the scheduler when this process belongs to the lane."""
    if handshake_address() is None:
        return
    sg = zmq_wire.sglang()  # SGLang, imported under the lane only
    registry, around, after = sg.hook_registry, sg.hook_type.AROUND, sg.hook_type.AFTER
    registry.register(f"{_CHANNELS}.create", create_channels, around)
    registry.register(f"{_SCHEDULER}.init_idle_sleeper", init_idle_sleeper, around)
    registry.register(f"{_SCHEDULER}.maybe_init_rust_server", dial_router, after)
    registry.register(f"{_RECEIVER}._pull_raw_reqs", pull_requests, around)
    registry.register(f"{_SCHEDULER}.run_event_loop", run_event_loop, around)
    # SIGTERM too: a stop sent to the whole process group (a terminal, a service manager)
    # reaches the scheduler with the launcher, and must drain it, not kill it.
    for signum in (DRAIN_SIGNAL, signal.SIGTERM):
        signal.signal(signum, _start_drain)


def _start_drain(signum: int, frame: object) -> None:
    _lane.draining = True
    if _lane.source is not None:
        _lane.source.draining = True


def create_channels(original: Any, cls: Any, *args: Any, **kwargs: Any) -> Any:
    """Rank zero: no tokenizer-manager sockets, our sender in both sender slots."""
    if not kwargs.get("is_rank_zero"):
        return original(cls, *args, **kwargs)
    import zmq  # noqa: PLC0415

    channels = original(cls, *args, **{**kwargs, "is_rank_zero": False})
    _lane.context = zmq.Context()
    _lane.sender = zmq_wire.OutputSender()
    return dataclasses.replace(
        channels, send_to_tokenizer=_lane.sender, send_to_detokenizer=_lane.sender
    )


def init_idle_sleeper(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    if _lane.sender is None:
        return original(scheduler, *args, **kwargs)
    scheduler.idle_sleeper = None  # set on the router's socket at the handshake
    return None


def ready_response(scheduler: Any) -> zmq_wire.ReadyResponse:
    """What the router reads at registration, from the loaded scheduler."""
    args = scheduler.server_args
    config = scheduler.model_config
    page = int(getattr(scheduler, "page_size", 1) or 1)
    tokens = int(getattr(scheduler, "max_total_num_tokens", 0) or 0)
    sg = zmq_wire.sglang()
    return zmq_wire.ReadyResponse(
        max_model_len=int(config.context_len),
        num_gpu_blocks=tokens // page,
        block_size=page,
        dtype=zmq_wire.wire_dtype(config.dtype),
        vllm_version=f"sglang-{sg.SGLANG_VERSION}",
        max_num_seqs=int(getattr(scheduler, "max_running_requests", 0) or 0),
        max_num_batched_tokens=max(0, int(getattr(scheduler, "chunked_prefill_size", 0) or 0)),
        instance_id=str(args.served_model_name or config.model_path),
        kv_cache_size_tokens=tokens,
        world_size=int(args.tp_size) * int(args.pp_size),
        tensor_parallel_size=int(args.tp_size),
        pipeline_parallel_size=int(args.pp_size),
    )


def dial_router(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """After ``maybe_init_rust_server``: register with the router; its socket feeds the
    scheduler from now on."""
    sender, address = _lane.sender, handshake_address()
    if sender is None or address is None:
        return None
    source = zmq_wire.handshake(
        _lane.context,
        address,
        engine_index=engine_index(),
        ready=ready_response(scheduler),
        sender=sender,
        # Built later in Scheduler.__init__: looked up when an output is sent.
        probe=lambda: scheduler.load_inquirer.get_loads(),  # noqa: PLW0108
        vocab_size=int(scheduler.model_config.vocab_size),
        tokenizer=getattr(scheduler, "tokenizer", None),
    )
    source.draining = _lane.draining
    _lane.source = source
    scheduler.recv_from_tokenizer = source
    if getattr(scheduler.server_args, "sleep_on_idle", False):
        sleeper = zmq_wire.sglang().IdleSleeper
        try:
            scheduler.idle_sleeper = sleeper(
                sockets=[source.socket], can_empty_cache=lambda: not scheduler._engine_paused
            )
        except TypeError:  # 0.5.20: no can_empty_cache
            scheduler.idle_sleeper = sleeper(sockets=[source.socket])
    return None


def pull_requests(original: Any, receiver: Any, *args: Any, **kwargs: Any) -> Any:
    """Where the router's socket is the source, drain it; a drained scheduler with nothing in
    flight exits 0 (the launcher then tells the router)."""
    source = receiver.recv_from_tokenizer
    if not isinstance(source, zmq_wire.RequestSource):
        return original(receiver, *args, **kwargs)
    if source.draining and not source.sender.live:
        logger.info("drained: nothing in flight; the scheduler stops")
        raise SystemExit(0)
    return source.drain(receiver.max_recv_per_poll)


def run_event_loop(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        if _lane.sender is not None:
            _lane.sender.send_dead()

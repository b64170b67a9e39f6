"""The Rust servicer lane for SGLang (``--servicer-impl rust``, issue #26): the ``smg`` wheel's
``smg.servicer.SglangGrpcServer`` answers ``sglang.grpc.scheduler.SglangScheduler`` from a Rust
thread, talking to SGLang's own scheduler over the msgpack ZMQ wire; Python runs only the
lifecycle.

Selected by ``--servicer-impl rust`` on ``python -m smg_servicer_sglang``, else by
``SMG_SGLANG_SERVICER_IMPL`` (the one way under ``sglang serve --smg-grpc-mode``, whose parser is
SGLang's), else ``python``; the choice and where it came from are logged. With ``rust``:

- SGLang's scheduler ranks start as on the router's ZMQ lane (:mod:`.headless`: SGLang's own
  spawner, the ``smg-zmq`` plugin inside the scheduler, the guard against input that would harm
  it); the scheduler dials the Rust server's handshake through our relay;
- the server answers health NOT_SERVING until the scheduler is connected, then SERVING;
- SIGTERM flips health to NOT_SERVING at once, then the scheduler drains: the streams in flight
  finish (``SMG_SGLANG_DRAIN_TIMEOUT_S``, 30 s), new ones are refused; exit 0;
- a scheduler that dies (killed, crashed) is reported to the server at once (the dead-engine
  sentinel, sent by the relay on its behalf): the open streams end with an error; exit 1;
- the server is built with exactly the keywords the installed binding accepts.

Not on this lane (exit 2, one line): TLS, the servicer's metrics port, ``--enable-trace`` (``smg``
1.13's binding takes none of them), data parallelism and prefill/decode roles (SGLang's ZMQ wire
serves neither),
``--enable-lora`` (refused by :mod:`.headless`, as on the ZMQ lane), a missing binding. Under
``sglang serve --smg-grpc-mode`` SGLang's HTTP sidecar is not started (it needs the Python
request manager).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from smg_servicer_core import rust_lane as lane
from smg_servicer_core.config import ResolvedSettings, environment, resolve
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.tls import TLS_SETTINGS

logger = logging.getLogger(__name__)

SERVICER_IMPL = lane.impl_setting(
    "sglang", "no --metrics-port, TLS, data parallelism, prefill/decode roles or LoRA there"
)
DRAIN = lane.drain_setting("sglang")
INSTALL = "pip install 'smg-servicer-sglang[rust]'"


def binding() -> Any:
    """The installed ``smg`` wheel's ``SglangGrpcServer`` (ConfigError: none)."""
    return lane.binding("SglangGrpcServer", INSTALL)


impl_line = lane.impl_line


def refuse_unserved(server_args: Any, settings: ResolvedSettings) -> None:
    """ConfigError for what was asked of the servicer that this lane cannot do."""
    asked = resolve(TLS_SETTINGS, server_args, environment())
    tls = any(asked[setting.name] for setting in TLS_SETTINGS)
    traces = "--enable-trace" if getattr(server_args, "enable_trace", False) else ""
    lane.refuse_unserved(tls=tls, metrics_port=settings["metrics_port"], traces=traces)


def server_keywords(
    server_args: Any, config: Any, facts: dict[str, Any], accepted: frozenset[str]
) -> dict[str, Any]:
    """What the server reports of the model and engine (``GetModelInfo``/``GetServerInfo``), as
    the Python servicer reports it, limited to ``accepted``. The scheduler's own info (its KV
    pool, its longest prompt) is not known before it starts: the server is built first, since
    the scheduler dials it while it starts."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415
    from smg_servicer_sglang import servicer  # noqa: PLC0415

    wanted = servicer.model_facts(config, facts, {}).values()
    wanted.pop("model_path")
    # The binding owns this lane's wire; its image path is not this package's and untested here,
    # so the lane says it takes no images and the router sends it none (README: the lane table).
    wanted["supports_vision"] = False
    wanted |= {
        "engine_count": 1,
        "tokenizer_dir": wanted["tokenizer_path"] or None,
        "server_args_json": json.dumps(sg.settings(server_args, config), default=str),
        "scheduler_info_json": "{}",
        "sglang_version": sg.SGLANG_VERSION,
        "max_running_requests": int(getattr(config, "max_running_requests", None) or 0),
        "data_parallel_size": 1,
    }
    return lane.keep_accepted(wanted, accepted)


def run(server_args: Any, settings: ResolvedSettings) -> int:
    """Serve SGLang's parsed server arguments on the Rust lane; the exit code."""
    from smg_servicer_sglang import _sglang as sg  # noqa: PLC0415
    from smg_servicer_sglang import headless  # noqa: PLC0415

    logger.info(impl_line(settings))
    lane.stop_while_starting()
    try:
        server_class = binding()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    handshake = f"tcp://127.0.0.1:{lane.free_port()}"
    with headless.dialing(handshake, 0) as relay:
        ready = headless.prepared(server_args)
        if isinstance(ready, str):
            print(f"error: {ready}", file=sys.stderr)
            return ExitCode.CONFIG
        port_args, config = ready
        try:
            refuse_unserved(server_args, settings)
            facts = sg.model_facts(server_args)
        except (ConfigError, ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return ExitCode.CONFIG
        keywords = server_keywords(server_args, config, facts, lane.accepted_keywords(server_class))
        return lane.serve_engine(
            server_class, f"{config.host}:{config.port}", handshake, str(config.model_path),
            keywords, engine="SGLang", alive=lane.children_alive,
            run=lambda: headless.supervise(relay, server_args, port_args, settings[DRAIN.name]),
        )  # fmt: skip

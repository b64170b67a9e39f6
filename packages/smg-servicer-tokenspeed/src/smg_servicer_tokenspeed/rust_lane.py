"""The Rust servicer lane for TokenSpeed (``--servicer-impl rust``, issue #26): the ``smg`` wheel's
``smg.servicer.TokenSpeedGrpcServer`` answers ``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` from
a Rust thread, talking to TokenSpeed's own scheduler ranks over TokenSpeed's msgpack ZMQ wire;
Python runs only the lifecycle.

Selected by ``--servicer-impl rust`` on ``python -m smg_grpc_servicer.tokenspeed``, else by
``SMG_TOKENSPEED_SERVICER_IMPL`` (the one way under ``ts serve``, which spawns that module with
TokenSpeed's flags), else ``python``; the choice and where it came from are logged. With ``rust``:

- no ``AsyncLLM`` is built: the scheduler ranks start as on the router's ZMQ lane
  (:mod:`.headless`: TokenSpeed's own start-up code, the guard against input that would harm the
  model, the drain) and dial the Rust server's handshake through our relay;
- the server answers health NOT_SERVING until the scheduler is connected, then SERVING;
- SIGTERM flips health to NOT_SERVING at once, then the ranks drain: the streams in flight finish
  (``SMG_TOKENSPEED_DRAIN_TIMEOUT_S``, 30 s), new ones are refused; exit 0;
- a rank that dies (killed, crashed) is reported to the server at once (the dead-engine sentinel,
  sent by the relay on its behalf): the open streams end with an error; exit 1;
- the server is built with exactly the keywords the installed binding accepts; what it reports of
  the model comes from the same facts as the Python servicer's (the scheduler's own start-up
  report is not known yet: the server is built first, since the ranks dial it while they start).

Not on this lane (exit 2, one line): TLS, the servicer's metrics port, ``--otlp-traces-endpoint``
(``smg`` 1.13's binding takes none of them), attention data parallelism and prefill/decode/encode
roles, a missing binding.
"""

# TokenSpeed ships no type information; its server arguments are read loosely on purpose.
# pyright: reportUnknownMemberType=false, reportUnknownArgumentType=false
from __future__ import annotations

import json
import logging
import sys
from typing import Any

from smg_servicer_core import rust_lane as lane
from smg_servicer_core.config import ResolvedSettings
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.tls import TLS_SETTINGS
from smg_servicer_core.zmq_lane import HandshakeRelay
from smg_servicer_tokenspeed.settings import DRAIN

logger = logging.getLogger(__name__)

INSTALL = "pip install 'smg-servicer-tokenspeed[rust]'"


def binding() -> Any:
    """The installed ``smg`` wheel's ``TokenSpeedGrpcServer`` (ConfigError: none)."""
    return lane.binding("TokenSpeedGrpcServer", INSTALL)


impl_line = lane.impl_line


def refuse_unserved(settings: ResolvedSettings) -> None:
    """ConfigError for what was asked of the servicer that this lane cannot do."""
    tls = any(settings[setting.name] for setting in TLS_SETTINGS)
    traces = "--otlp-traces-endpoint" if settings.get("otlp_traces_endpoint") else ""
    lane.refuse_unserved(tls=tls, metrics_port=settings["metrics_port"], traces=traces)


def server_keywords(
    server_args: Any, facts: dict[str, Any], accepted: frozenset[str]
) -> dict[str, Any]:
    """What the server reports of the model and engine (``GetModelInfo``/``GetServerInfo``),
    from the facts the Python servicer reports, limited to ``accepted``."""
    from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415
    from smg_servicer_tokenspeed import info  # noqa: PLC0415

    model = str(server_args.model)
    tokenizer = str(server_args.tokenizer or model)
    wanted: dict[str, Any] = {
        "engine_count": 1,
        "tokenizer_dir": tokenizer,
        "tokenizer_path": tokenizer,
        "served_model_name": str(server_args.served_model_name or model),
        "model_type": facts["model_type"],
        "architectures": facts["architectures"],
        "max_context_length": facts["context_length"],
        "vocab_size": facts["vocab_size"],
        "eos_token_ids": facts["eos_token_ids"],
        "pad_token_id": facts["pad_token_id"],
        "bos_token_id": facts["bos_token_id"],
        "supports_multimodal": bool(facts["modalities"]),
        "supported_modalities": facts["modalities"],
        "tokenspeed_version": ts.TOKENSPEED_VERSION,
        "server_args_json": json.dumps(info.server_args(server_args, {})),
        "scheduler_info_json": "{}",
        "max_running_requests": int(getattr(server_args, "max_num_seqs", None) or 0),
        "data_parallel_size": 1,
    }
    return lane.keep_accepted(wanted, accepted)


def run(server_argv: list[str], settings: ResolvedSettings) -> int:
    """Serve TokenSpeed's flags ``server_argv`` on the Rust lane; the exit code."""
    logger.info(impl_line(settings))
    lane.stop_while_starting()
    try:
        from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415
        from smg_servicer_tokenspeed import headless  # noqa: PLC0415

        server_class = binding()
        server_args = ts.prepare_headless(server_argv)
        why = headless.unsupported(server_args)
        if why is not None:
            raise ConfigError(why)
        refuse_unserved(settings)
        facts = ts.headless_model_facts(server_args)
    except (ConfigError, ImportError, ValueError, TypeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    keywords = server_keywords(server_args, facts, lane.accepted_keywords(server_class))
    handshake = f"tcp://127.0.0.1:{lane.free_port()}"
    relay = HandshakeRelay(handshake)
    try:
        return lane.serve_engine(
            server_class, f"{server_args.host}:{server_args.port}", handshake,
            str(server_args.model), keywords, engine="TokenSpeed", alive=lane.children_alive,
            run=lambda: headless.supervise(relay, server_args, settings[DRAIN.name]),
        )  # fmt: skip
    finally:
        relay.close()

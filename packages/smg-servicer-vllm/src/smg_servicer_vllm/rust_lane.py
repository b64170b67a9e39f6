"""The Rust servicer lane for vLLM (``--servicer-impl rust``, issue #26): the ``smg`` wheel's
``smg.servicer.VllmGrpcServer`` answers ``vllm.grpc.engine.VllmEngine`` from a Rust thread,
talking to vLLM's engine cores over ZMQ; Python runs only the lifecycle.

Selected on vLLM's gRPC launcher (``vllm serve M --grpc`` or ``python -m
vllm.entrypoints.[launchers.]grpc_server``, what ``smg serve --servicer-impl rust`` starts) by
``--servicer-impl rust``, else ``SMG_VLLM_SERVICER_IMPL``, else ``python``; the choice and where
it came from are logged. With ``rust`` the plugin hands the launcher's ``serve_grpc`` to
:func:`run` before any AsyncLLM is built, and:

- the engine cores start headless with vLLM's own code and process manager (the ZMQ lane's
  launcher, :mod:`.headless`: its guard against requests that would kill a core, its drain);
  they dial the Rust server's handshake through the relay (:class:`HandshakeRelay`);
- the server answers health NOT_SERVING until the engine is connected, then SERVING;
- SIGTERM flips health to NOT_SERVING at once, then vLLM drains the cores (``--shutdown-timeout``,
  30 s unless given): the streams in flight finish; exit 0;
- a core that dies (killed, crashed) is reported to the server at once (vLLM's
  ``ENGINE_CORE_DEAD``, sent by the relay on its behalf): the open streams end with an error
  within a second; exit 1;
- the server is built with exactly the keywords the installed binding accepts (read from its
  signature); what it does not take is logged and left out.

Not on this lane (exit 2, one line): media processing (``--mm-processor``), TLS and the servicer's
metrics port (``smg`` 1.13's binding takes none of them), and a missing binding.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import multiprocessing
import sys
from types import SimpleNamespace
from typing import Any

from smg_servicer_core import rust_lane as lane
from smg_servicer_core.entry import ExitCode
from smg_servicer_core.errors import ConfigError
from smg_servicer_vllm import info, logs, releases

logger = logging.getLogger(__name__)

IMPLS = lane.IMPLS
SERVICER_IMPL = lane.impl_setting("vllm", "no --metrics-port, TLS or --mm-processor there")
BINDING = lane.BINDING
INSTALL = "pip install 'smg-servicer-vllm[rust]'"
accepted_keywords = lane.accepted_keywords


def binding() -> Any:
    """The installed ``smg`` wheel's ``VllmGrpcServer`` (ConfigError: none)."""
    return lane.binding("VllmGrpcServer", INSTALL, BINDING)


def require_upstream_hook() -> None:
    """What ``smg serve --servicer-impl rust`` checks before it launches anything: this
    interpreter's vLLM loads our plugin (which selects the lane) and the Rust binding is there.
    RuntimeError, naming the fix, otherwise."""
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    if not any(p.value.startswith("smg_servicer_vllm.plugin") for p in plugins):
        raise RuntimeError(
            "vLLM does not load the smg-servicer plugin here: pip install smg-servicer-vllm"
        )
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("--servicer-impl rust needs vLLM: pip install 'smg-servicer-vllm[vllm]'")
    try:
        binding()
    except ConfigError as exc:
        raise RuntimeError(str(exc)) from None


def server_keywords(config: Any, accepted: frozenset[str]) -> dict[str, Any]:
    """What the server reports of the model and engine (``GetModelInfo``/``GetServerInfo``), as
    the Python servicer reports it, limited to ``accepted``."""
    engine = SimpleNamespace(model_config=config.model_config, vllm_config=config)
    facts = info.model_facts(engine)
    served = info.server_info(engine, 0, 0.0)
    parallel = config.parallel_config
    wanted: dict[str, Any] = {
        "engine_count": int(getattr(parallel, "data_parallel_size_local", 1) or 1),
        "tokenizer_dir": facts.tokenizer_path or None,
        "served_model_name": facts.served_model_name,
        "tokenizer_path": facts.tokenizer_path,
        "is_generation": facts.is_generation,
        "max_context_length": facts.max_context_length,
        "vocab_size": facts.vocab_size,
        "supports_vision": False,
        "model_type": facts.model_type,
        "architectures": list(facts.architectures),
        "eos_token_ids": list(facts.eos_token_ids),
        "pad_token_id": facts.pad_token_id,
        "bos_token_id": facts.bos_token_id,
        "default_sampling_params_json": json.dumps(dict(facts.default_sampling_params)),
        "data_parallel_size": served.data_parallel_size,
        "pairing_protocol": served.pairing_protocol,
        "kv_connector": served.kv_connector,
        "kv_role": served.kv_role,
        "kv_engine_id": served.kv_engine_id,
        "kv_cache_dtype": served.kv_cache_dtype,
        "attention_backend": served.attention_backend,
        "model_dtype": served.model_dtype,
        "block_size": served.block_size,
        "max_num_seqs": served.max_num_seqs,
        "log_stats": not bool(getattr(config.observability_config, "disable_log_stats", False)),
    }
    return lane.keep_accepted(wanted, accepted)


def refuse_unserved(settings: Any) -> None:
    """ConfigError for what a launcher asked of the Python servicer that this lane cannot do."""
    if settings is None:
        return
    if settings.mm.source != "default" and settings.mm.processor != "off":
        raise ConfigError("--mm-processor is not served by --servicer-impl rust")
    lane.refuse_unserved(
        tls=settings.tls is not None, metrics_port=settings.metrics["metrics_port"]
    )


def headless_args(launch: argparse.Namespace, argv: list[str]) -> argparse.Namespace:
    """The headless serve namespace of a launcher command line: vLLM's defaults, then every
    engine value the launcher parsed (its ``--host``/``--port`` are the gRPC server's)."""
    from smg_servicer_vllm import headless  # noqa: PLC0415 - zmq: the plugin imports this module

    args = headless.parse([str(launch.model), "--zmq-handshake-address", "tcp://127.0.0.1:1"])
    keep_drain = not any(a.split("=", 1)[0] == "--shutdown-timeout" for a in argv)
    for name, value in vars(launch).items():
        if name in ("host", "port", "headless") or not hasattr(args, name):
            continue
        if name == "shutdown_timeout" and keep_drain:
            continue
        setattr(args, name, value)
    return args


def run(launch: argparse.Namespace, settings: Any, argv: list[str] | None = None) -> int:
    """Serve a launcher command line on the Rust lane; the exit code (core's table).
    ``settings``: what the plugin resolved of that command line (its ``LauncherSettings``)."""
    # vLLM (loaded by its launcher by now) and zmq: the plugin imports this module everywhere.
    from smg_servicer_vllm import _engine, headless  # noqa: PLC0415 - vLLM, zmq

    logs.route_through_vllm()  # vLLM configured its logger after the launcher's parse
    logger.info(settings.impl_line)
    lane.stop_while_starting()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        refuse_unserved(settings)
        server_class = binding()
        args = headless_args(launch, argv)
        serve = _engine.serve_subcommand()
        serve.validate(args)
        config = _engine.engine_config(args)
    except (ConfigError, ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.CONFIG
    handshake = f"tcp://127.0.0.1:{lane.free_port()}"
    args.zmq_handshake_address = handshake
    keywords = server_keywords(config, accepted_keywords(server_class))
    return lane.serve_engine(
        server_class, f"{launch.host}:{launch.port}", handshake, str(launch.model), keywords,
        engine="vLLM", alive=_cores_alive, before=headless.prepare_environment,
        run=lambda: headless.run(args, serve.cmd),
    )  # fmt: skip


def _cores_alive() -> bool:
    return any(p.name.startswith("EngineCore") for p in multiprocessing.active_children())


def take_over(settings: Any) -> None:
    """Make the gRPC launcher's ``serve_grpc`` (looked up when the launcher calls it, from its
    module or from ``__main__``) serve this lane and exit with its code: no AsyncLLM is built.
    ``settings``: what the plugin's parse of the launcher's command line resolved."""

    async def serve_grpc(args: argparse.Namespace) -> None:
        raise SystemExit(run(args, settings))

    modules = [importlib.import_module(releases.launcher_module()), sys.modules.get("__main__")]
    for module in modules:
        if module is not None and hasattr(module, "serve_grpc"):
            setattr(module, "serve_grpc", serve_grpc)  # noqa: B010 - a module's global

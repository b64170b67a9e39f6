"""The only module that imports TokenSpeed (``tokenspeed`` 0.1.1).

It parses TokenSpeed's flags, launches the scheduler ranks and the in-process ``AsyncLLM`` through
TokenSpeed's own ``_launch_subprocesses``, builds TokenSpeed's request objects from the plain
values of :mod:`.convert`, and starts the front end's receive loops under the servicer's control
(not TokenSpeed's SIGTERM watchdog, which would kill the process tree on its own schedule).

``SMG_TOKENSPEED_SCHEDULER=module:function`` replaces the scheduler process's entry point
(TokenSpeed's ``run_event_loop(server_args, port_args, pipe_writer)``) before the launch: what the
CPU tests use to stand in for the GPU scheduler (``smg_servicer_tokenspeed.testing.scheduler:run``).
Everything between gRPC and the scheduler socket stays TokenSpeed's own code.
"""

# TokenSpeed ships no type information; this boundary is checked loosely on purpose.
# pyright: reportMissingImports=false, reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportMissingTypeStubs=false, reportAttributeAccessIssue=false
from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import multiprocessing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from smg_servicer_core.config import Setting, setting_value
from smg_servicer_core.errors import ConfigError, FailedPrecondition
from smg_servicer_core.tensors import RawTensor
from smg_servicer_tokenspeed.convert import ChildSpec
from smg_servicer_tokenspeed.mm import MmItem

INSTALL_HINT = (
    "TokenSpeed is not installed in this environment: install it from its own runtime "
    "(pip install tokenspeed; on a CPU for development see tools/envs/tokenspeed-cpu/)"
)

try:
    import tokenspeed.runtime.entrypoints.engine as _entry
    from tokenspeed.runtime.engine import io_struct as _io
    from tokenspeed.runtime.engine import zmq_msgpack as _zmq_msgpack
    from tokenspeed.runtime.pd import kv_events as _kv
    from tokenspeed.runtime.utils.server_args import PortArgs, prepare_server_args
    from tokenspeed.version import __version__ as _version
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(INSTALL_HINT, name="tokenspeed") from _err

#: TokenSpeed's scheduler wire (``io_struct``) and KV-event publisher module (``pd.kv_events``),
#: as ``Any``: the stand-in scheduler and this module use them.
io: Any = _io
kv: Any = _kv
#: TokenSpeed's engine side of the router's direct ZMQ wire (``connect_msgpack_engine``).
zmq_msgpack: Any = _zmq_msgpack
TOKENSPEED_VERSION: str = str(_version)

logger = logging.getLogger(__name__)

__all__ = [
    "TOKENSPEED_VERSION",
    "LaunchError",
    "Launched",
    "headless_model_facts",
    "io",
    "launch",
    "launch_headless",
    "prepare",
    "prepare_headless",
    "zmq_msgpack",
]

SCHEDULER_ENTRY = Setting(
    "scheduler_entry",
    str,
    "",
    "module:function replacing TokenSpeed's scheduler process entry (tests, CPU development)",
    env="SMG_TOKENSPEED_SCHEDULER",
)


class LaunchError(Exception):
    """The scheduler ranks did not come up (a rank died or reported a failure)."""

    processes: list[Any] = []


def prepare(argv: list[str]) -> Any:
    """TokenSpeed's ``ServerArgs`` from its flags (``--help`` prints TokenSpeed's help and exits).

    The servicer sends token ids and the router detokenizes, so TokenSpeed's inline detokenizer
    is switched off (no text is built per step) and ``output_ids`` stay cumulative per request
    (``stream_output`` off), which is what the output conversion reads.
    """
    args = prepare_server_args(argv)
    args.enable_inline_detokenizer = False
    args.stream_output = False
    return args


def prepare_headless(argv: list[str]) -> Any:
    """TokenSpeed's ``ServerArgs`` from its flags, as ``ts serve --headless`` reads them."""
    return prepare_server_args(argv)


def model_config(server_args: Any) -> Any:
    """TokenSpeed's own ``ModelConfig`` for ``server_args``, built as its front end and its
    encode loop build it."""
    from tokenspeed.runtime.configs.model_config import ModelConfig  # noqa: PLC0415

    return ModelConfig(
        server_args.model,
        trust_remote_code=server_args.trust_remote_code,
        revision=server_args.revision,
        context_length=server_args.max_model_len,
        model_override_args=server_args.hf_overrides,
        dtype=server_args.dtype,
        quantization=server_args.quantization,
        server_args=server_args,
    )


def headless_model_facts(server_args: Any) -> dict[str, Any]:
    """:func:`model_facts` before any front end exists (the Rust lane builds no ``AsyncLLM``):
    TokenSpeed's own ``ModelConfig`` from ``server_args``, as ``AsyncLLM`` builds it; the
    scheduler's longest prompt is not known yet (0)."""
    from types import SimpleNamespace  # noqa: PLC0415

    server_args.model, server_args.tokenizer = _entry.prepare_model_and_tokenizer(
        server_args.model, server_args.tokenizer
    )
    config = model_config(server_args)
    front = SimpleNamespace(
        model_config=config, context_len=config.context_len, tokenizer=None, max_req_input_len=0
    )
    return model_facts(front)


def _scheduler_entry() -> Callable[..., Any] | None:
    spec = setting_value(SCHEDULER_ENTRY)
    if not spec:
        return None
    module, _, name = spec.partition(":")
    try:
        entry = getattr(importlib.import_module(module), name or "run")
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"SMG_TOKENSPEED_SCHEDULER={spec!r} cannot be imported") from exc
    if not callable(entry):
        raise ConfigError(f"SMG_TOKENSPEED_SCHEDULER={spec!r} is not callable")
    return entry  # pyright: ignore[reportUnknownVariableType]


@dataclass
class Launched:
    """A running TokenSpeed engine: its front end, scheduler ranks and start-up report."""

    llm: Any
    server_args: Any
    scheduler_info: dict[str, Any]
    processes: list[Any]


def launch(server_args: Any) -> Launched:
    """Start the scheduler ranks and the ``AsyncLLM`` (blocking until every rank is ready).

    Must run on the main thread (TokenSpeed installs its launch-phase signal handler there).
    Raises :class:`LaunchError` when a rank dies or reports a failure during start-up."""
    entry = _scheduler_entry()
    if entry is not None:
        logger.warning("TokenSpeed's scheduler is replaced by %s", setting_value(SCHEDULER_ENTRY))
        _entry.run_event_loop = entry
    before = set(multiprocessing.active_children())
    port_args = PortArgs.init_new(server_args)
    try:
        llm, _, info = _entry._launch_subprocesses(server_args, port_args)  # pyright: ignore[reportPrivateUsage]
    except (EOFError, RuntimeError) as exc:
        raise LaunchError(
            f"a scheduler rank failed during start-up ({type(exc).__name__})"
        ) from exc
    processes = [p for p in multiprocessing.active_children() if p not in before]
    if llm is None:
        raise LaunchError("this node runs no front end (node_rank >= 1 is not served over gRPC)")
    return Launched(llm, server_args, dict(info or {}), processes)


def scheduler_entry() -> Callable[..., Any]:
    """What a scheduler rank runs: TokenSpeed's ``run_event_loop``, or the replacement that
    ``SMG_TOKENSPEED_SCHEDULER`` names."""
    return _scheduler_entry() or _entry.run_event_loop


def aim_headless(server_args: Any, host: str, port: int) -> None:
    """Make ``server_args`` start the scheduler ranks the way ``ts serve --headless`` does (the
    msgpack wire, no tokenizer: the router sends token ids), dialing ``tcp://host:port``."""
    server_args.zmq_msgpack = True
    server_args.skip_tokenizer_init = True
    server_args.data_parallel_address = host
    server_args.data_parallel_rpc_port = port


def launch_headless(server_args: Any, target: Callable[..., Any]) -> list[Any]:
    """Start this node's scheduler ranks, each running ``target`` (``run_event_loop``'s
    signature), and wait until every one is ready: TokenSpeed's own ``launch_scheduler_headless``
    up to its supervision, which is the caller's (it terminates the ranks on SIGTERM; ours
    drains them). The ranks, started; :class:`LaunchError` when one dies or fails starting (the
    ranks started are the error's ``processes``)."""
    _entry._set_envs_and_config(server_args)  # pyright: ignore[reportPrivateUsage]
    port_args = PortArgs.init_new(server_args)
    server_args.model, server_args.tokenizer = _entry.prepare_model_and_tokenizer(
        server_args.model, server_args.tokenizer
    )
    mapping = server_args.mapping
    first = mapping.nprocs_per_node * server_args.node_rank
    processes: list[Any] = []
    readers: list[Any] = []
    for rank in range(first, first + mapping.nprocs_per_node):
        rank_args = copy.copy(server_args)
        rank_args.mapping = copy.deepcopy(mapping)
        rank_args.mapping.rank = rank
        reader, writer = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.Process(target=target, args=(rank_args, port_args, writer))
        process.start()
        processes.append(process)
        readers.append(reader)
    for i, reader in enumerate(readers):
        try:
            status = reader.recv().get("status")
        except EOFError:
            status = None
        if status != "ready":
            error = LaunchError(f"scheduler rank {i} failed during start-up")
            error.processes = processes
            raise error
    return processes


def start_frontend(llm: Any, on_failure: Callable[[str], None]) -> list[asyncio.Task[None]]:
    """Start the front end's receive loops on the running loop (instead of its
    ``auto_create_handle_loop``, which would also install TokenSpeed's SIGTERM handler and its
    process-killing watchdog). A loop that fails reports ``on_failure`` (the engine is dead)."""
    llm.no_create_loop = True
    loop = asyncio.get_running_loop()

    async def guarded(name: str, run: Callable[[], Awaitable[None]]) -> None:
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("TokenSpeed's %s failed", name)
            on_failure(f"TokenSpeed's {name} failed")

    tasks = [
        loop.create_task(guarded("output loop", llm.handle_loop)),
        loop.create_task(guarded("load-snapshot loop", llm.load_snapshot_loop)),
    ]
    llm.asyncio_tasks.update(tasks)
    llm._maybe_launch_rl_control_plane(loop)  # pyright: ignore[reportPrivateUsage]
    return tasks


#: The dtypes a feature is cast to (TokenSpeed's ``multimodal_encoder_dtype``).
FEATURE_DTYPES = ("bfloat16", "float16", "float32")


def _torch_dtype(name: str) -> Any:
    """core.tensors' dtype names are torch's attribute names."""
    import torch  # noqa: PLC0415 - TokenSpeed imported it already

    return getattr(torch, name)


def _tensor(raw: RawTensor) -> Any:
    import torch  # noqa: PLC0415

    dtype = _torch_dtype(raw.dtype)
    if not raw.data:
        return torch.empty(raw.shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw.data), dtype=dtype).reshape(raw.shape)


def _data_item(item: MmItem, feature_dtype: str) -> Any:
    """TokenSpeed's ``MultimodalDataItem`` for one item, its feature cast to ``feature_dtype``."""
    from tokenspeed.runtime.multimodal import inputs as mmi  # noqa: PLC0415

    feature = _tensor(item.feature) if item.feature is not None else None
    if feature is not None and feature_dtype in FEATURE_DTYPES:
        feature = feature.to(_torch_dtype(feature_dtype))
    data = mmi.MultimodalDataItem(
        modality=mmi.Modality[item.modality.upper()],
        hash=item.hash,
        offsets=list(item.offsets),
        feature=feature,
        model_specific_data={k: _tensor(v) for k, v in item.model_specific.items()},
        encode_handshake=item.encode_handshake,
    )
    data.set_pad_value()
    return data


def multimodal_inputs(items: list[MmItem], feature_dtype: str = "") -> Any:
    """TokenSpeed's ``MultimodalInputs`` for one request's items (a fresh object per choice: the
    front end publishes each one's features to shared memory on its own)."""
    from tokenspeed.runtime.multimodal import inputs as mmi  # noqa: PLC0415

    built = [_data_item(item, feature_dtype) for item in items]
    token = {
        i.modality: i.placeholder_token_id for i in items if i.placeholder_token_id is not None
    }
    return mmi.MultimodalInputs(
        mm_items=built, im_token_id=token.get("image"), video_token_id=token.get("video")
    )


def generate_input(spec: ChildSpec, *, log_metrics: bool = True, feature_dtype: str = "") -> Any:
    """TokenSpeed's ``GenerateReqInput`` for one choice."""
    host, port, room = spec.bootstrap if spec.bootstrap is not None else (None, None, None)
    req = io.GenerateReqInput(
        input_ids=list(spec.input_ids),
        sampling_params=dict(spec.sampling),
        return_logprob=spec.return_logprob,
        logprob_start_len=spec.logprob_start_len,
        top_logprobs_num=spec.top_logprobs_num,
        token_ids_logprob=spec.token_ids_logprob,
        stream=spec.stream,
        log_metrics=log_metrics,
        bootstrap_host=host,
        bootstrap_port=port,
        bootstrap_room=room,
        data_parallel_rank=spec.data_parallel_rank,
    )
    if spec.mm_items:
        req.precomputed_multimodal_inputs = multimodal_inputs(spec.mm_items, feature_dtype)
    req.rid = spec.rid
    return req


def disaggregation_mode(server_args: Any) -> str:
    """TokenSpeed's ``--disaggregation-mode``: null, prefill, decode or encode."""
    return str(getattr(server_args, "disaggregation_mode", None) or "null")


def encode_bootstrap(server_args: Any) -> tuple[str, int]:
    """Where prefill workers reach an encode worker's own bootstrap server: TokenSpeed's host
    address (``TOKENSPEED_HOST_IP`` or ``HOST_IP``, else the host's) and
    ``--disaggregation-bootstrap-port``."""
    from tokenspeed.runtime.utils.network import get_ip  # noqa: PLC0415

    host = get_ip()
    if host in ("", "0.0.0.0"):
        raise FailedPrecondition(
            "this encode worker's address is unknown: set TOKENSPEED_HOST_IP to the address its "
            "prefill workers reach it on"
        )
    return host, int(server_args.disaggregation_bootstrap_port)


def encode_request(
    rid: str, bootstrap: tuple[str, int, int], item: MmItem, feature_dtype: str = ""
) -> Any:
    """TokenSpeed's ``EncodeRequest`` (its encode loop's one message): ``bootstrap`` is this
    worker's bootstrap server and the prefill peer's room on it; ``item`` what the vision tower
    runs."""
    from tokenspeed.runtime.epd.encode_worker import EncodeRequest  # noqa: PLC0415

    host, port, room = bootstrap
    return EncodeRequest(
        request_id=rid,
        bootstrap_host=host,
        bootstrap_port=port,
        bootstrap_room=room,
        items=[_data_item(item, feature_dtype)],
    )


def dp_size(server_args: Any) -> int:
    """Attention data-parallel ranks (each has a scheduler, a load snapshot, a KV publisher)."""
    try:
        return max(int(server_args.mapping.attn.dp_size), 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def model_facts(llm: Any) -> dict[str, Any]:
    """What ``GetModelInfo`` reports of the model, from TokenSpeed's ``ModelConfig``."""
    config = llm.model_config
    hf = config.hf_config
    tokenizer = llm.tokenizer
    eos = getattr(config, "hf_eos_token_id", None) or getattr(hf, "eos_token_id", None)
    eos_ids = sorted(eos) if isinstance(eos, set | list | tuple) else ([eos] if eos else [])
    if not eos_ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        eos_ids = [int(tokenizer.eos_token_id)]
    modalities: list[str] = []
    if getattr(config, "is_multimodal", False):
        modalities.append("image")
        if getattr(hf, "video_token_id", None) is not None:
            modalities.append("video")
    return {
        "vocab_size": int(config.vocab_size),
        "context_length": int(llm.context_len),
        "is_generation": bool(config.is_generation),
        "model_type": str(getattr(hf, "model_type", "") or ""),
        "architectures": list(getattr(hf, "architectures", None) or []),
        "eos_token_ids": [int(t) for t in eos_ids],
        "pad_token_id": int(getattr(hf, "pad_token_id", None) or 0),
        "bos_token_id": int(getattr(hf, "bos_token_id", None) or 0),
        "max_req_input_len": int(llm.max_req_input_len or 0),
        "modalities": modalities,
    }

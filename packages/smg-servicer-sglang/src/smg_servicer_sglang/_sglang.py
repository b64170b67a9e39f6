"""The only module that imports SGLang: scheduler launch, the IPC wire types and model facts.

Everything SGLang-version-specific lives here, so the request manager and the servicer work on
the names below and plain values. Releases 0.5.20-0.5.23 differ (../README.md's table says which
run and which are read), and the differences are taken by capability, never by version string:

- every request is built through :func:`_struct`, which passes only the keywords the installed
  release's struct has (0.5.21 inserted ``token_indices_to_pool`` and appended ``kv_hints``,
  ``pp_prefetch_ticketed``, ``sampling_logprobs_mode``; 0.5.23 appended ``lora_name``): the
  structs are positional msgspec structs, so the release's own class fixes the wire order;
- outputs are read by name through the release's own decoder; fields some releases lack are
  read with a default (``spec_*``), and 0.5.20's ``output_token_sampling_logprobs`` (removed in
  0.5.21) is not read at all;
- the schedulers are launched through ``Engine._launch_scheduler_processes``, whose signature is
  the same in every release, with a scheduler entry that forwards whatever it is given
  (``run_scheduler_process`` lost ``attn_cp_rank, moe_dp_rank, moe_ep_rank`` in 0.5.21; the DP
  controller gained ``prelaunched_schedulers`` in 0.5.22): the release's own launcher passes its
  own arguments;
- the DP rank count is ``num_dp_ranks`` from 0.5.22 (whose ``dp_size`` counts replicas),
  ``dp_size`` before.
"""

# SGLang ships no type information; this boundary is checked loosely on purpose.
# pyright: reportMissingImports=false, reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportMissingTypeStubs=false, reportAttributeAccessIssue=false, reportUnknownParameterType=false, reportMissingParameterType=false

from __future__ import annotations

import logging
import signal
import socket
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from types import SimpleNamespace
from typing import Any

import psutil

try:
    import sglang as _sglang
except ImportError as err:  # pragma: no cover - exercised by the facade's test
    raise ImportError(
        "smg_servicer_sglang needs SGLang: pip install 'smg-servicer-sglang[sglang]'",
        name="sglang",
    ) from err
from sglang.srt.arg_groups.model_override_base import resolved_view
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST, DisaggregationMode
from sglang.srt.entrypoints.engine import Engine, _set_envs_and_config
from sglang.srt.lora.lora_registry import LoRARef as _LoRARef
from sglang.srt.lora.lora_registry import LoRARegistry as _LoRARegistry
from sglang.srt.managers import io_struct as _io
from sglang.srt.managers.load_snapshot import create_load_snapshot_reader
from sglang.srt.managers.schedule_batch import FINISH_ABORT as _FINISH_ABORT
from sglang.srt.managers.schedule_batch import Modality as _Modality
from sglang.srt.managers.schedule_batch import MultimodalDataItem as _MultimodalDataItem
from sglang.srt.managers.schedule_batch import MultimodalProcessorOutput as _MmOutput
from sglang.srt.managers.scheduler import run_scheduler_process
from sglang.srt.managers.scheduler_components.idle_sleeper import IdleSleeper as _IdleSleeper
from sglang.srt.observability import metrics_collector as _mc
from sglang.srt.observability import trace as _trace
from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats as _ApiTimeStats
from sglang.srt.observability.startup_time import build_engine_startup_time
from sglang.srt.parser.template_detection import resolve_auto_parsers
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang.srt.runtime_context import (
    get_disagg,
    get_observability,
    get_parallel,
    get_serving,
    get_spec,
    publish,
)
from sglang.srt.sampling import sampling_params as _sampling
from sglang.srt.server_args import PortArgs
from sglang.srt.server_args import prepare_server_args as _prepare_server_args
from sglang.srt.utils import common as _common
from sglang.srt.utils.common import configure_logger, set_prometheus_multiproc_dir
from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer
from sglang.srt.utils.msgpack_utils import dec_hook as _dec_hook
from sglang.srt.utils.msgpack_utils import ext_hook as _ext_hook

from smg_servicer_core.config import environment
from smg_servicer_core.errors import InvalidRequest, Unsupported
from smg_servicer_sglang import grammar_hooks
from smg_servicer_sglang.convert import ReqSpec
from smg_servicer_sglang.images import MAX_IMAGES, Images, rules_of

logger = logging.getLogger(__name__)

SGLANG_VERSION: str = str(_sglang.__version__)

# The wire types and helpers the servicer uses, re-exported as ``Any``: SGLang ships no types,
# and code outside this module must not depend on its internals beyond these names.
AbortReq: Any = _io.AbortReq
BatchEmbeddingOutput: Any = _io.BatchEmbeddingOutput
BatchTokenIDOutput: Any = _io.BatchTokenIDOutput
#: A scheduler finish that aborts: ``(message, status_code, err_type)``.
FINISH_ABORT: Any = _FINISH_ABORT
FlushCacheReqInput: Any = _io.FlushCacheReqInput
FlushCacheReqOutput: Any = _io.FlushCacheReqOutput
HealthCheckOutput: Any = _io.HealthCheckOutput
LoadLoRAAdapterReqInput: Any = _io.LoadLoRAAdapterReqInput
UnloadLoRAAdapterReqInput: Any = _io.UnloadLoRAAdapterReqInput
#: The scheduler's reply to an adapter load or unload (one per rank).
LoRAUpdateOutput: Any = _io.LoRAUpdateOutput
#: SGLang's own adapter registry (the tokenizer manager's: names -> ids, in-flight counts).
LoRARegistry: Any = _LoRARegistry
LoRARef: Any = _LoRARef
ProfileReq: Any = _io.ProfileReq
ProfileReqOutput: Any = _io.ProfileReqOutput
ProfileReqType: Any = _io.ProfileReqType
TokenizedEmbeddingReqInput: Any = _io.TokenizedEmbeddingReqInput
TokenizedGenerateReqInput: Any = _io.TokenizedGenerateReqInput
SamplingParams: Any = _sampling.SamplingParams
#: A batch's per-request scheduler time stats, pickled on the wire (None stays None).
unwrap_from_pickle: Any = _io.unwrap_from_pickle
async_sock_send: Any = _io.async_sock_send
async_sock_recv: Any = _io.async_sock_recv
# The router's ZMQ lane (zmq_wire, zmq_plugin): SGLang's own msgpack hooks for its structs, the
# plugin hook registry, and the scheduler's idle sleeper.
msgpack_dec_hook: Any = _dec_hook
msgpack_ext_hook: Any = _ext_hook
hook_registry: Any = HookRegistry
hook_type: Any = HookType
IdleSleeper: Any = _IdleSleeper


def internal_params(tokenizer: Any, **fields: Any) -> Any:
    """SamplingParams normalized as the scheduler expects every request's to be."""
    params = SamplingParams(**fields)
    params.normalize(tokenizer)
    return params


def _checked_params(sampling: dict[str, Any], vocab_size: int, tokenizer: Any) -> Any:
    """SGLang's own checks on top of ours (ValueError -> INVALID_ARGUMENT)."""
    try:
        params = SamplingParams(**sampling)
        params.verify(vocab_size)
        params.normalize(tokenizer)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(str(exc)) from exc
    return params


def _struct(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)`` for the installed release: a keyword its struct lacks (a field a later
    release added) is left out while it is None (the struct's default there); one that carries
    a value is refused (UNIMPLEMENTED) rather than dropped unseen."""
    known: tuple[str, ...] = cls.__struct_fields__
    absent = [name for name in fields if name not in known]
    carried = sorted(name for name in absent if fields[name] is not None)
    if carried:
        raise Unsupported(
            f"SGLang {SGLANG_VERSION} cannot take {', '.join(carried)} "
            f"(its {cls.__name__} has no such field)"
        )
    return cls(**{name: value for name, value in fields.items() if name in known})


def _wire_fields(spec: ReqSpec) -> dict[str, Any]:
    """``spec.fields`` with the prompt as the ``array('q')`` SGLang's IPC carries."""
    return {**spec.fields, "input_ids": array("q", spec.fields["input_ids"])}


def mm_output(images: Images | None) -> Any:
    """SGLang's ``MultimodalProcessorOutput`` for checked images: one image item per image
    (its pixels, its placeholder span as inclusive offsets), the family's image, start and end
    tokens. The scheduler hashes each item into its pad values."""
    if images is None:
        return None
    import torch  # noqa: PLC0415 - SGLang's own dependency

    raw = images.pixel_values
    # images.PIXEL_DTYPES are torch's own names.
    pixels = torch.frombuffer(bytearray(raw.data), dtype=getattr(torch, raw.dtype))
    rules = images.rules
    if rules.patch_features:
        return _patch_output(images, pixels.reshape(-1, rules.patch_features))
    pixels = pixels.reshape(images.count, 3, *raw.shape[-2:])
    items = [
        _MultimodalDataItem(
            modality=_Modality.IMAGE,
            feature=pixels[i : i + 1].clone(),
            offsets=[(offset, offset + length - 1)],
        )
        for i, (offset, length) in enumerate(images.spans)
    ]
    return _MmOutput(
        mm_items=items,
        im_token_id=rules.image_token_id,
        im_start_id=rules.start_id,
        im_end_id=rules.end_id,
    )


def _patch_output(images: Images, pixels: Any) -> Any:
    """A patch family's (Qwen2-VL's) output, as SGLang's own Qwen-VL processor makes it: one
    item per picture (its patches, its ``image_grid_thw`` row, its span) and the prompt's M-RoPE
    positions from SGLang's ``MRotaryEmbedding.get_rope_index``."""
    import torch  # noqa: PLC0415 - SGLang's own dependency
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding  # noqa: PLC0415

    rules = images.rules
    grids = torch.tensor(images.grids, dtype=torch.long)
    items: list[Any] = []
    start = 0
    for i, (offset, length) in enumerate(images.spans):
        patches = int(grids[i].prod())
        items.append(
            _MultimodalDataItem(
                modality=_Modality.IMAGE,
                feature=pixels[start : start + patches].clone(),
                offsets=[(offset, offset + length - 1)],
                model_specific_data={"image_grid_thw": grids[i : i + 1].clone()},
            )
        )
        start += patches
    positions, delta = MRotaryEmbedding.get_rope_index(
        spatial_merge_size=rules.merge,
        image_token_id=rules.image_token_id,
        video_token_id=rules.video_token_id,
        vision_start_token_id=rules.start_id,
        model_type=rules.family,
        input_ids=torch.tensor([images.prompt], dtype=torch.long),
        image_grid_thw=grids,
    )
    return _MmOutput(
        mm_items=items,
        im_token_id=rules.image_token_id,
        im_start_id=rules.start_id,
        im_end_id=rules.end_id,
        video_token_id=rules.video_token_id,
        mrope_positions=positions.squeeze(1),
        mrope_position_delta=delta,
    )


def _adapter_fields(cls: Any, adapter: tuple[str, str] | None) -> dict[str, Any]:
    """The request's adapter, ``(lora_id, lora_name)``: its id, and its name where the release's
    struct carries one (0.5.23 added ``lora_name``; the scheduler names KV events with it)."""
    if adapter is None:
        return {"lora_id": None}
    lora_id, name = adapter
    if "lora_name" in cls.__struct_fields__:
        return {"lora_id": lora_id, "lora_name": name}
    return {"lora_id": lora_id}


def build_generate(
    spec: ReqSpec, vocab_size: int, tokenizer: Any, adapter: tuple[str, str] | None = None
) -> Any:
    """SGLang's ``TokenizedGenerateReqInput`` for ``spec`` (from :mod:`.convert`); ``adapter``:
    the resolved LoRA adapter, ``(lora_id, lora_name)`` (:mod:`.lora`)."""
    fields = _wire_fields(spec) | _adapter_fields(TokenizedGenerateReqInput, adapter)
    fields["mm_inputs"] = mm_output(fields.get("mm_inputs"))
    return _struct(
        TokenizedGenerateReqInput,
        rid=spec.rid,
        input_embeds=None,
        token_type_ids=None,
        sampling_params=_checked_params(spec.sampling, vocab_size, tokenizer),
        **fields,
    )


def build_embed(spec: ReqSpec, tokenizer: Any) -> Any:
    """SGLang's ``TokenizedEmbeddingReqInput`` for ``spec``."""
    fields = _wire_fields(spec)
    return _struct(
        TokenizedEmbeddingReqInput,
        rid=spec.rid,
        mm_inputs=None,
        sampling_params=internal_params(tokenizer, **spec.sampling),
        **fields,
    )


#: SGLang's own warm-up and health requests on a prefill or decode worker name this bootstrap
#: host (room 0): the request runs on that worker alone, with no KV transfer.
LOCAL_ONLY = {"bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": 0}


def disaggregation_mode(config: Any) -> str:
    """SGLang's ``--disaggregation-mode`` (null, prefill, decode) in the resolved settings."""
    return str(getattr(config, "disaggregation_mode", None) or "null")


def needs_bootstrap(config: Any) -> bool:
    """A prefill or decode worker whose KV moves between workers (not the ``fake`` backend,
    whose decode worker serves requests on its own)."""
    backend = str(getattr(config, "disaggregation_transfer_backend", None) or "")
    return disaggregation_mode(config) != "null" and backend != "fake"


def local_only(config: Any) -> dict[str, Any]:
    """The bootstrap fields of a request that must run on this worker alone (warm-up, health):
    SGLang's own, on a prefill or decode worker; none otherwise."""
    return dict(LOCAL_ONLY) if disaggregation_mode(config) != "null" else {}


def start_bootstrap_server(config: Any) -> Any:
    """A prefill worker's KV bootstrap server (SGLang starts it in the tokenizer manager, which
    this servicer replaces), on ``--host`` and ``--disaggregation-bootstrap-port``; None on other
    roles. Keep the reference: the server lives as long as it does."""
    from sglang.srt.managers.disagg_service import start_disagg_service  # noqa: PLC0415

    if disaggregation_mode(config) != "prefill":
        return None
    return start_disagg_service()


@dataclass
class EncoderSide:
    """A language-only worker's half of SGLang's encoder disaggregation, as SGLang's tokenizer
    manager (which this servicer replaces) holds it: the bootstrap server encoders register with
    and the receiver that sends a request's images to them (``zmq_to_scheduler``: the encoders
    push the embeddings to the scheduler ranks, which wait for them)."""

    receiver: Any
    bootstrap: Any
    urls: list[str]


def encoder_side(server_args: Any, config: Any) -> EncoderSide | None:
    """The encoder side of a ``--language-only`` worker (None on any other). ``ValueError`` for
    what this worker cannot serve: another transfer backend than ``zmq_to_scheduler`` (mooncake
    allocates CUDA buffers; ``zmq_to_tokenizer`` needs SGLang's own tokenizer manager), SGLang's
    gRPC receiver mode (0.5.23 fails every dispatch: its ``encode`` takes no ``time_stats_json``),
    or a bootstrap port that is taken (SGLang's server would fail silently in its thread)."""
    if not getattr(config, "language_only", False):
        return None
    backend = str(getattr(config, "encoder_transfer_backend", None) or "")
    if backend != "zmq_to_scheduler":
        raise ValueError(
            f"--encoder-transfer-backend {backend}: a language-only worker behind this servicer "
            "takes zmq_to_scheduler only"
        )
    from sglang.srt.disaggregation.encoder.receiver import (  # noqa: PLC0415
        EncoderBootstrapServer,
        create_mm_receiver,
    )
    from sglang.srt.environ import envs  # noqa: PLC0415

    mode = str(envs.SGLANG_ENCODER_MM_RECEIVER_MODE.get())
    if mode != "http":
        raise ValueError(
            f"SGLANG_ENCODER_MM_RECEIVER_MODE={mode}: a language-only worker behind this "
            "servicer takes the http receiver only (SGLang's grpc receiver fails every dispatch)"
        )
    host, port = str(config.host), int(config.encoder_bootstrap_port)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"the encoder bootstrap server cannot listen on port {port} "
                f"({exc.strerror or type(exc).__name__})"
            ) from None
    urls = [str(u) for u in (getattr(config, "encoder_urls", None) or [])]
    receiver = create_mm_receiver(server_args, encode_urls=urls)
    bootstrap = EncoderBootstrapServer(host=host, port=port, urls=urls)
    return EncoderSide(receiver, bootstrap, urls)


def dispatch_images(side: EncoderSide, req: Any, urls: list[str], on_error: Any) -> Any:
    """Send ``req``'s pictures to the encoders (SGLang's own receiver, as its tokenizer manager
    does) and mark the request to wait for their embeddings. The event it returns must be set
    once the request is sent (or given up): a dispatch error reaches ``on_error`` only then.
    None when no encoder is registered."""
    request = SimpleNamespace(
        rid=req.rid, image_data=list(urls), video_data=None, audio_data=None,
        mm_content_hashes=None,
    )  # fmt: skip
    ready = side.receiver.send_encode_request(request, on_dispatch_error=on_error)
    if ready is None:
        return None
    req.need_wait_for_mm_inputs = True
    req.num_items_assigned = request.num_items_assigned
    req.encoder_urls = request.encoder_urls
    return ready


#: What fails a request that waits on its encoders (sent once the request is).
EncoderDispatchErrorReq: Any = _io.EncoderDispatchErrorReq


def build_probe(
    rid: str, is_generation: bool, tokenizer: Any, local: dict[str, Any] | None = None
) -> Any:
    """The health probe's request: one greedy token from prompt ``[0]`` (a generative model),
    or the embedding of ``[0]``; ``local``: the bootstrap fields that keep it on this worker
    (:func:`local_only`)."""
    ids = array("q", [0])
    if is_generation:
        return _struct(
            TokenizedGenerateReqInput,
            rid=rid, input_text=None, input_ids=ids, input_embeds=None, mm_inputs=None,
            token_type_ids=None,
            sampling_params=internal_params(tokenizer, max_new_tokens=1, temperature=0.0),
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
            token_ids_logprob=None, stream=False, **(local or {}),
        )  # fmt: skip
    return _struct(
        TokenizedEmbeddingReqInput,
        rid=rid, input_text=None, input_ids=ids, mm_inputs=None, token_type_ids=None,
        sampling_params=internal_params(tokenizer, max_new_tokens=0),
    )  # fmt: skip


def prepare_server_args(argv: list[str]) -> Any:
    """SGLang's own ``sglang serve`` flag parsing."""
    return _prepare_server_args(argv)


class SchedulerStartError(RuntimeError):
    """A scheduler process exited or reported a failure before it was ready."""


def _run_scheduler(*args: Any, **kwargs: Any) -> None:
    """A scheduler rank, with Ctrl+C left to the servicer (which stops the ranks in order) and
    the grammar hooks installed (:mod:`.grammar_hooks`: a constraint that cannot continue ends
    its request as such, never the engine). Also the entry of a DP controller's ranks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    grammar_hooks.install(HookRegistry, HookType.AROUND, FINISH_ABORT)
    run_scheduler_process(*args, **kwargs)


@dataclass
class Launched:
    """What the scheduler launch gives the servicer."""

    port_args: Any
    scheduler_info: dict[str, Any]
    processes: list[BaseProcess]
    dp_size: int
    load_reader: Any = None
    #: Every scheduler-side process, the DP controller's ranks (grandchildren) included.
    pids: list[int] = field(default_factory=list)
    #: The ranks' start-up timings as SGLang's launcher reports them (:func:`startup_time`).
    startup_time: dict[str, Any] | None = None

    def dead(self) -> str | None:
        """Why a scheduler-side process is gone, or None while all run."""
        for proc in self.processes:
            if not proc.is_alive():
                return f"scheduler process {proc.pid} exited with code {proc.exitcode}"
        for pid in self.pids:
            try:
                gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                return f"scheduler process {pid} exited"
        return None


#: SGLang's metrics folders, held for the life of the process (:func:`prepare`).
_KEPT_FOLDERS: list[Any] = []


def prepare(server_args: Any) -> tuple[Any, Any]:
    """Validate and publish ``server_args`` as the tokenizer role; returns fresh ``PortArgs`` and
    the resolved settings (read every setting through these: raw ``ServerArgs`` fields stay
    unset where SGLang derives them, the tokenizer path for one, and the resolution record is
    not kept once the schedulers start).

    The same steps, in the same order, as SGLang's own launcher before it spawns schedulers.
    Raises ``ValueError`` (or SGLang's own errors) for an invalid configuration.
    """
    configure_logger(server_args)
    server_args.resolve_once()
    # With --enable-metrics, SGLang's gRPC entry has made the metrics folder already (and named
    # it in PROMETHEUS_MULTIPROC_DIR); _set_envs_and_config makes a second one inside it and
    # drops its handle on the first, whose folder would then be deleted under the ranks.
    _KEPT_FOLDERS.append(getattr(_common, "prometheus_multiproc_dir", None))
    _set_envs_and_config(server_args)
    load_plugins()
    server_args.check_server_args()
    resolve_auto_parsers(server_args)
    publish(server_args, role="tokenizer")
    config = resolved_view(server_args)
    return PortArgs.init_new(server_args), config


def settings(server_args: Any, config: Any) -> dict[str, Any]:
    """Every resolved setting by name (for GetServerInfo)."""
    return {name: getattr(config, name, None) for name in server_args.__struct_fields__}


def launch_schedulers(server_args: Any, port_args: Any) -> Launched:
    """Start every scheduler rank this node runs (TP/PP ranks, or the DP controller) and wait
    until all report ready. Blocking: call it off the event loop. On failure nothing is left
    running and :class:`SchedulerStartError` says which rank failed."""
    result, procs = Engine._launch_scheduler_processes(server_args, port_args, _run_scheduler)
    processes: list[BaseProcess] = list(procs or [])
    try:
        result.wait_for_ready()
    except BaseException as exc:
        terminate(processes)
        raise SchedulerStartError(str(exc) or type(exc).__name__) from exc
    info = dict(result.scheduler_infos[0])
    reader = create_load_snapshot_reader(port_args, caller="TokenizerManager")
    pids = sorted({int(pid) for pid in result.all_child_pids} | {p.pid for p in processes if p.pid})
    startup = startup_time(list(result.scheduler_infos))
    return Launched(port_args, info, processes, dp_size(), reader, pids, startup)


def tokenizer_metrics(server_args: Any) -> Any:
    """SGLang's own tokenizer-side metrics (``--enable-metrics``), as its tokenizer manager makes
    them: a ``TokenizerMetricsCollector`` with SGLang's labels and buckets, or None with metrics
    off. After :func:`prepare`, before the schedulers launch: unless it is set already, it points
    ``PROMETHEUS_MULTIPROC_DIR`` (SGLang's own helper) at the folder the scheduler ranks then
    write their families to (core's ``multiprocess_folder``)."""
    observability = get_observability()
    if not observability.enable_metrics:
        return None
    if "PROMETHEUS_MULTIPROC_DIR" not in environment():
        set_prometheus_multiproc_dir()
    if hasattr(_mc, "tokenizer_metric_labels"):  # 0.5.23
        labels = _mc.tokenizer_metric_labels()
    else:  # 0.5.20-0.5.22 build the same two in the tokenizer manager
        mode = get_disagg().disaggregation_mode
        labels = {
            "model_name": get_serving().served_model_name,
            "engine_type": DisaggregationMode.to_engine_type(mode),
        }
    start_cpu_monitor_thread("tokenizer")  # sglang:process_cpu_seconds, as its tokenizer's
    collector_class = _mc.resolve_collector_class(
        _mc.STAT_LOGGER_ROLE_TOKENIZER, _mc.TokenizerMetricsCollector
    )
    return collector_class(
        server_args=server_args,
        labels=labels,
        bucket_time_to_first_token=observability.bucket_time_to_first_token,
        bucket_e2e_request_latency=observability.bucket_e2e_request_latency,
        bucket_inter_token_latency=observability.bucket_inter_token_latency,
    )


def start_request_tracing(server_args: Any) -> bool:
    """SGLang's own request tracing in this process, the part its tokenizer manager plays under
    its HTTP server (``--enable-trace``, ``--otlp-traces-endpoint``): SGLang's tracer, whose
    request spans the scheduler ranks continue (they start their own tracer themselves). False
    with tracing off."""
    observability = get_observability()
    if not observability.enable_trace:
        return False
    _trace.process_tracing_init(
        observability.otlp_traces_endpoint,
        getattr(observability, "otlp_service_name", None) or "sglang",
        trace_modules=getattr(observability, "trace_modules", None),
    )
    _trace.trace_set_thread_info("smg-servicer")  # this thread's request spans' label
    return True


class RequestTrace:
    """One request's SGLang trace, as its tokenizer manager keeps it: SGLang's own root span
    (``Req <rid>``), a child of the caller's W3C context (the router's ``grpc_execute``), handed
    to the scheduler on the tokenized request (its ``time_stats``), where SGLang's scheduler
    spans (queue, prefill, decode) continue it."""

    def __init__(self, rid: str, headers: dict[str, str], disagg_mode: str) -> None:
        self.stats = _ApiTimeStats(disagg_mode=DisaggregationMode(disagg_mode))
        self.stats.init_trace_ctx(rid, None, headers)
        self.stats.set_created_time()
        self._first = False

    def attach(self, req: Any) -> None:
        """Onto the tokenized request, pickled as SGLang's scheduler reads it."""
        self.stats.set_tokenize_finish_time()
        self.stats.set_api_server_dispatch_time()
        req.time_stats = self.stats
        req.wrap_pickle_fields()

    def first_token(self) -> None:
        if not self._first:
            self._first = True
            self.stats.set_first_token_time()

    def finish(self) -> None:
        """Ends SGLang's root span (with its latency attributes)."""
        self.stats.set_finished_time()


def startup_time(scheduler_infos: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The start-up timings SGLang's tokenizer manager reports (``sglang:startup_time_seconds``
    by phase), built by SGLang from its ranks' as its launcher builds them; None when the ranks
    report none. ``tokenizer_e2e``: from this process's start until now (the ranks are ready)."""
    timings = [info.get("startup_time") for info in scheduler_infos]
    if not any(timings):
        return None
    since_start = time.time() - psutil.Process().create_time()
    return build_engine_startup_time(timings, tokenizer_e2e=since_start)


def prefill_only() -> bool:
    """A prefill worker of a prefill/decode pair: it never sees a first token (no TTFT)."""
    return get_disagg().disaggregation_mode == DisaggregationMode.PREFILL.value


def drafts_per_verify() -> int:
    """Draft tokens one speculative verify step proposes, as SGLang's tokenizer manager counts
    them (the configured draft tokens less the bonus one; after :func:`prepare`); 0 without
    speculation."""
    drafts = getattr(get_spec(), "speculative_num_draft_tokens", None)
    return max(int(drafts or 1) - 1, 0)


def dp_size() -> int:
    """Data-parallel ranks of the published configuration (after :func:`prepare`)."""
    parallel = get_parallel()
    # 0.5.22 names the rank count num_dp_ranks (its dp_size counts replicas); before, dp_size.
    ranks = getattr(parallel, "num_dp_ranks", None)
    return int((parallel.dp_size if ranks is None else ranks) or 1)


def terminate(
    processes: list[BaseProcess], join_s: float = 2.0, pids: list[int] | None = None
) -> None:
    """SIGTERM each rank, wait ``join_s``, then SIGKILL what is left; then SIGKILL any other
    scheduler-side process still running (``pids``: a DP controller's ranks). Every child is
    reaped."""
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=join_s)
        if proc.is_alive():
            logger.warning("scheduler pid %s did not stop; killing it", proc.pid)
            proc.kill()
            proc.join(timeout=1.0)
    leftovers: list[psutil.Process] = []
    for pid in pids or []:
        try:
            leftover = psutil.Process(pid)
            if leftover.status() != psutil.STATUS_ZOMBIE:
                leftover.kill()
                leftovers.append(leftover)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(leftovers, timeout=join_s)


def model_facts(server_args: Any) -> dict[str, Any]:
    """Vocabulary, context, special ids and architecture from the model's own config."""
    config = ModelConfig.from_server_args(server_args)
    hf: Any = config.hf_config
    text: Any = getattr(config, "hf_text_config", hf)
    eos: Any = getattr(config, "hf_eos_token_id", None) or getattr(hf, "eos_token_id", None)
    if isinstance(eos, int):
        eos_ids = [eos]
    elif eos:
        eos_ids = sorted(int(x) for x in eos)
    else:
        eos_ids = []
    return {
        "vocab_size": int(config.vocab_size),
        "context_length": int(config.context_len),
        "is_generation": bool(config.is_generation),
        "model_type": str(getattr(hf, "model_type", "") or ""),
        "architectures": [str(a) for a in (getattr(hf, "architectures", None) or [])],
        "eos_token_ids": eos_ids,
        "pad_token_id": int(getattr(text, "pad_token_id", None) or 0),
        "bos_token_id": int(getattr(text, "bos_token_id", None) or 0),
        "num_labels": int(getattr(hf, "num_labels", 0) or 0),
        "id2label": dict(getattr(hf, "id2label", None) or {}),
        # Images: a vision model SGLang serves as one (its multimodal switch on) of a family
        # whose image rules the servicer knows (images.FAMILIES).
        "image_rules": (
            rules_of(hf, getattr(server_args, "limit_mm_data_per_request", None))
            if getattr(config, "is_image_understandable_model", False)
            else None
        ),
        "max_images": int(
            (getattr(server_args, "limit_mm_data_per_request", None) or {}).get("image", MAX_IMAGES)
        ),
        # A language-only worker (encoder disaggregation): its images are computed by SGLang's
        # encoder servers; the prompt holds one image token per picture, which SGLang expands.
        "encoder_image_token": (
            int(hf.image_token_id)
            if getattr(server_args, "language_only", False)
            and getattr(hf, "image_token_id", None) is not None
            else None
        ),
    }


def load_tokenizer(server_args: Any) -> Any:
    """The HF tokenizer SGLang itself would use (None under ``--skip-tokenizer-init``)."""
    if server_args.skip_tokenizer_init:
        return None
    return get_tokenizer(
        server_args.tokenizer_path,
        tokenizer_mode=server_args.tokenizer_mode,
        trust_remote_code=server_args.trust_remote_code,
        tokenizer_revision=server_args.revision,
    )

"""What our vLLM servicer and plugin use of vLLM, for ``test_release_conformance`` (the vLLM
package's tests) to check in every declared release's wheel: :data:`USES` (each module, symbol,
member, keyword and call shape, with our file that relies on it) and :data:`EXCEPTIONS` (the
classes :mod:`smg_servicer_vllm.errors` maps). Data only: the reading and checking stay in the
test module. Imports vLLM-free parts of our package only."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import smg_servicer_vllm
from smg_servicer_core.proto import vllm_engine_pb2 as pb

SRC = Path(smg_servicer_vllm.__file__).parent


# What we use -----------------------------------------------------------------------------------


def _sampling_keywords() -> frozenset[str]:
    """The ``SamplingParams`` keywords :func:`smg_servicer_vllm.sampling.to_sampling_spec` builds
    (its ``kwargs`` dict, read from the source so the list cannot go stale)."""
    tree = ast.parse((SRC / "sampling.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "kwargs"
            and isinstance(node.value, ast.Dict)
        ):
            return frozenset(str(k.value) for k in node.value.keys if isinstance(k, ast.Constant))
    raise AssertionError("sampling.py: to_sampling_spec's kwargs dict was not found")


#: ``StructuredOutputsParams`` keywords: one per proto constraint (``json_schema`` is ``json``).
STRUCTURED_KEYWORDS = frozenset(
    "json" if f.name == "json_schema" else f.name
    for f in pb.SamplingParams.DESCRIPTOR.oneofs_by_name["constraint"].fields
)
SAMPLING_KEYWORDS = _sampling_keywords() | {"output_kind", "structured_outputs", "extra_args"}


@dataclass(frozen=True)
class Use:
    """One thing our code uses of vLLM: ``path`` is ``module`` or ``module:Name.member...``.

    ``args``/``keywords``: it is called with that many positional arguments and those keywords
    (None: not called). ``read``: read as an attribute (a value or a property, not a method).
    ``since``: a capability our code detects, first in that release; before it our code does
    ``without``."""

    path: str
    ours: str
    args: int | None = None
    keywords: frozenset[str] = frozenset()
    read: bool = False
    since: str = ""
    without: str = ""


def _uses() -> list[Use]:
    def u(path: str, ours: str, args: int | None = None, *keywords: str, **more: Any) -> Use:
        return Use(path, ours, args, frozenset(keywords), **more)

    def read(owner: str, ours: str, *names: str) -> list[Use]:
        joint = "" if owner.endswith(":") else "."
        return [Use(f"{owner}{joint}{name}", ours, read=True) for name in names]

    llm = "vllm.v1.engine.async_llm:AsyncLLM"
    model = "vllm.config:ModelConfig"
    mm_config = "vllm.config.multimodal:MultiModalConfig"
    inputs = "vllm.multimodal.inputs"
    field = f"{inputs}:MultiModalFieldConfig"
    connection = "vllm.connections:HTTPConnection"
    connector = "vllm.multimodal.media.connector"
    processor = "vllm.multimodal.processing:BaseMultiModalProcessor"
    stats = "vllm.v1.metrics"
    serve = "vllm.entrypoints.cli.serve:ServeSubcommand"
    core = "vllm.v1.engine.core:EngineCore"
    return [
        # _engine.py: the request objects and the parser class
        u("vllm.version", "_engine.py: VLLM_VERSION"),
        Use("vllm.version:__version__", "_engine.py: VLLM_VERSION", read=True),
        u("vllm:SamplingParams", "_engine.py: sampling_params()", 0, *SAMPLING_KEYWORDS),
        u("vllm:SamplingParams", "_engine.py: greedy_params()", 0, *_GREEDY),
        u("vllm:TokensPrompt", "_engine.py: tokens_prompt()", 0, "prompt_token_ids"),
        Use("vllm:TokensPrompt.prompt", "_engine.py: tokens_prompt() sets the key", read=True),
        Use(
            "vllm:TokensPrompt.cache_salt",
            "_engine.py: tokens_prompt() sets the key (servicer.py: an image's decode side)",
            read=True,
        ),
        u("vllm:PoolingParams", "_engine.py: embed_params()", 0, "task"),
        *read("vllm.sampling_params:RequestOutputKind", "_engine.py", "DELTA", "FINAL_ONLY"),
        u(
            "vllm.sampling_params:StructuredOutputsParams",
            "_engine.py: sampling_params() (sampling.py's constraints)",
            0,
            *STRUCTURED_KEYWORDS,
        ),
        u(
            "vllm.utils.argparse_utils:FlexibleArgumentParser",
            "_mm_engine.py: sidecar_parser()",
            0,
            "prog",
            "description",
        ),
        u(
            "vllm.utils.argparse_utils:FlexibleArgumentParser.parse_known_args",
            "plugin.py: _wrap() calls the original as (self, args, namespace)",
            2,
        ),
        # _mm_engine.py: the multimodal engine side
        u("vllm", "_mm_engine.py: vllm.__version__"),
        Use("vllm:__version__", "_mm_engine.py: fingerprint_of()", read=True),
        u("vllm.envs", "_mm_engine.py"),
        *read("vllm.envs:", "_mm_engine.py", "VLLM_MEDIA_CONNECTOR", "VLLM_VIDEO_LOADER_BACKEND"),
        u(connection, "_mm_engine.py: GuardedConnection.__init__ (super)", 0, "reuse_client"),
        u(f"{connection}._validate_http_url", "_mm_engine.py: GuardedConnection", 1),
        u(f"{connection}._headers", "_mm_engine.py: GuardedConnection (**extra_headers)", 0),
        u(f"{connection}.get_sync_client", "_mm_engine.py: GuardedConnection overrides it", 0),
        u(f"{connection}.get_async_client", "_mm_engine.py: GuardedConnection overrides it", 0),
        u(f"{connection}.get_async_response", "_mm_engine.py: GuardedConnection overrides", 1),
        u(
            "vllm.inputs.engine:mm_input",
            "_mm_engine.py: tensor_input(), sidecar_input()",
            4,
            "prompt",
        ),
        *read(
            "vllm.inputs.engine:MultiModalInput",
            "_mm_engine.py, mm_sidecar/jobs.py, media_identity.py: the engine input's keys",
            "prompt_token_ids",
            "mm_kwargs",
            "mm_hashes",
            "mm_placeholders",
            "arrival_time",
        ),
        u("vllm.multimodal:MULTIMODAL_REGISTRY.create_processor", "_mm_engine.py, _mm_layouts", 1),
        u(f"{field}.flat_from_sizes", "_mm_engine.py: _field_config()", 2, "keep_on_cpu"),
        u(f"{field}.batched", "_mm_engine.py: _field_config()", 1, "keep_on_cpu"),
        u(f"{field}.shared", "_mm_engine.py: _field_config()", 2, "keep_on_cpu"),
        u(f"{inputs}:MultiModalKwargsItems", "_mm_engine.py: tensor_input()", 1),
        u(f"{inputs}:MultiModalKwargsItems.from_hf_inputs", "_mm_engine.py: _batch()", 2),
        u(f"{inputs}:MultiModalKwargsItem", "_mm_engine.py: decode_item() (isinstance)"),
        u(
            f"{inputs}:PlaceholderRange",
            "_mm_engine.py: _placeholders(), sidecar_input()",
            0,
            "offset",
            "length",
            "is_embed",
        ),
        u(f"{inputs}:PlaceholderRange.get_num_embeds", "_mm_layouts.py: _samples()", 0),
        u(f"{connector}:MEDIA_CONNECTOR_REGISTRY.load", "_mm_engine.py: InprocessProcessor", 1),
        u(
            f"{connector}:MediaConnector",
            "_mm_engine.py: InprocessProcessor (MEDIA_CONNECTOR_REGISTRY.load's keywords)",
            0,
            "media_io_kwargs",
            "connection",
            "allowed_local_media_path",
            "allowed_media_domains",
        ),
        *(
            u(f"{connector}:MediaConnector.fetch_{m}_async", "_mm_engine.py: _fetch_one()", 1)
            for m in ("image", "video", "audio")
        ),
        u(
            "vllm.v1.serial_utils:MsgpackEncoder",
            "_mm_engine.py: encode_item()",
            0,
            "size_threshold",
        ),
        u("vllm.v1.serial_utils:MsgpackEncoder.encode", "_mm_engine.py: encode_item()", 1),
        u("vllm.v1.serial_utils:MsgpackDecoder", "_mm_engine.py: _decoder()", 1),
        u("vllm.v1.serial_utils:MsgpackDecoder.decode", "_mm_engine.py: decode_item()", 1),
        u(
            "vllm.multimodal.encoder_budget:MultiModalBudget",
            "_mm_engine.py: mm_facts() (enable_cache=: a fallback, see check_fallbacks)",
            2,
        ),
        u(
            "vllm.multimodal.encoder_budget:MultiModalBudget.get_encoder_budget",
            "_mm_engine.py: mm_facts()",
            0,
        ),
        Use(
            "vllm.multimodal.encoder_budget:MultiModalBudget.mm_max_toks_per_item",
            "_mm_engine.py: mm_facts() (the per-item bound of tensor requests)",
            read=True,
        ),
        u(
            "vllm.renderers.base:BaseRenderer.process_for_engine_async",
            "_mm_engine.py: InprocessProcessor.process() (skip_mm_cache=: a fallback)",
            2,
        ),
        u("vllm.renderers.registry:renderer_from_config", "_mm_engine.py: sidecar_renderer()", 1),
        u(
            "vllm.engine.arg_utils:AsyncEngineArgs.add_cli_args",
            "_mm_engine.py: sidecar_parser()",
            1,
        ),
        u(
            "vllm.engine.arg_utils:AsyncEngineArgs.from_cli_args",
            "_mm_engine.py: sidecar_renderer()",
            1,
        ),
        u(
            "vllm.engine.arg_utils:AsyncEngineArgs.create_engine_config",
            "_mm_engine.py: sidecar_renderer()",
            0,
        ),
        Use(
            "vllm.engine.arg_utils:AsyncEngineArgs.quantization",
            "_mm_engine.py: sidecar_renderer() clears it",
            read=True,
        ),
        # _mm_layouts.py: the processor's dummy items
        u(
            "vllm.config.multimodal:ImageDummyOptions",
            "_mm_layouts.py: _samples()",
            0,
            "count",
            "width",
            "height",
        ),
        u(
            "vllm.config.multimodal:VideoDummyOptions",
            "_mm_layouts.py: _samples()",
            0,
            "count",
            "num_frames",
            "width",
            "height",
        ),
        u(
            "vllm.config.multimodal:AudioDummyOptions",
            "_mm_layouts.py: _samples()",
            0,
            "count",
            "length",
        ),
        # _mm_layouts.py: an item's embeddings as the processor counts them
        u(f"{processor}._get_prompt_updates", "_mm_layouts.py: _ProcessorCount", 3),
        u("vllm.multimodal.parse:MultiModalDataItems", "_mm_layouts.py: _ProcessorCount", 0),
        *read(
            "vllm.multimodal.processing:PromptUpdate", "_mm_layouts.py: _ProcessorCount", "modality"
        ),
        u("vllm.multimodal.processing:PromptUpdate.resolve", "_mm_layouts.py: _ProcessorCount", 1),
        *read(
            "vllm.multimodal.processing.processor:ResolvedPromptUpdate",
            "_mm_layouts.py: _ProcessorCount",
            "content",
        ),
        *read(
            "vllm.multimodal.processing:PromptUpdateDetails",
            "_mm_layouts.py: _ProcessorCount",
            "full",
            "is_embed",
        ),
        u(
            "vllm.multimodal.processing.context:TimingContext",
            "_mm_layouts.py: sample()",
            0,
            "enabled",
        ),
        u(f"{processor}.apply", "_mm_layouts.py: sample()", 1, "timing_ctx"),
        *read(processor, "_mm_layouts.py, _mm_engine.py", "info", "dummy_inputs"),
        *read(
            "vllm.multimodal.processing:BaseProcessingInfo",
            "_mm_engine.py: mm_facts(), _mm_layouts.py: _samples()",
            "allowed_mm_limits",
            "ctx",
        ),
        Use(
            "vllm.multimodal.processing.context:InputProcessingContext.model_config",
            "_mm_layouts.py: _samples()",
            read=True,
        ),
        u(
            "vllm.multimodal.processing:BaseDummyInputsBuilder.get_dummy_mm_data",
            "_mm_layouts.py: _samples()",
            3,
        ),
        # the engine, its configuration and its outputs (servicer.py, info.py, kv_events.py,
        # health_servicer.py, convert.py, _mm_engine.py)
        *read(
            llm,
            "servicer.py, info.py, kv_events.py, health_servicer.py, _mm_engine.py",
            "model_config",
            "vllm_config",
            "renderer",
            "output_processor",
            "logger_manager",
            "errored",
        ),
        u(
            f"{llm}.generate",
            "servicer.py: Generate",
            3,
            "tokenization_kwargs",
            "trace_headers",
            "data_parallel_rank",
            "reasoning_ended",
        ),
        u(f"{llm}.encode", "servicer.py: Embed", 3),
        u(f"{llm}.abort", "servicer.py: engine_abort()", 1),
        u(f"{llm}.check_health", "health_servicer.py: the probe", 0),
        u(f"{llm}.reset_prefix_cache", "servicer.py: FlushCache", 0),
        u(f"{llm}.start_profile", "servicer.py: StartProfile", 0),
        u(f"{llm}.stop_profile", "servicer.py: StopProfile", 0),
        u(
            "vllm.v1.engine.output_processor:OutputProcessor.get_num_unfinished_requests",
            "info.py: engine_load() without stat loggers (/metrics only)",
            0,
        ),
        *read(
            f"{stats}.loggers:StatLoggerManager",
            "info.py: managed_ranks(), scheduler_stats()",
            "stat_loggers",
            "engine_indexes",
        ),
        Use(f"{llm}.engine_core", "info.py: managed_ranks() without stat loggers", read=True),
        Use(
            "vllm.v1.engine.core_client:MPClient.engine_ranks_managed",
            "info.py: managed_ranks() without stat loggers",
            read=True,
        ),
        *read(
            f"{stats}.loggers:LoggingStatLogger",
            "info.py: scheduler_stats()",
            "last_scheduler_stats",
            "engine_index",
        ),
        Use(
            f"{stats}.loggers:PerEngineStatLoggerAdapter.per_engine_stat_loggers",
            "info.py: scheduler_stats() (the default logging, one logger per rank)",
            read=True,
        ),
        Use(
            f"{stats}.loggers:AggregatedLoggingStatLogger.last_scheduler_stats_dict",
            "info.py: scheduler_stats() (--aggregate-engine-logging)",
            read=True,
        ),
        *read(
            f"{stats}.stats:SchedulerStats",
            "info.py: rank_counts()",
            "kv_cache_usage",
            "num_running_reqs",
            "num_waiting_reqs",
        ),
        *read(
            model,
            "servicer.py, info.py, _mm_engine.py, _mm_layouts.py",
            "model",
            "dtype",
            "max_model_len",
            "tokenizer",
            "served_model_name",
            "runner_type",
            "hf_config",
            "multimodal_config",
            "is_multimodal_model",
            "allowed_local_media_path",
            "allowed_media_domains",
        ),
        u(f"{model}.get_vocab_size", "servicer.py: _prompt(), info.py", 0),
        u(f"{model}.get_diff_sampling_param", "info.py: default_sampling()", 0),
        *read(
            mm_config,
            "_mm_engine.py",
            "media_io_kwargs",
            "mm_processor_kwargs",
            "limit_per_prompt",
            "language_model_only",
        ),
        u(f"{mm_config}.get_limit_per_prompt", "_mm_engine.py: fingerprint_of()", 1),
        *read(
            "vllm.config:VllmConfig",
            "info.py, kv_events.py, mm_sidecar/jobs.py",
            "model_config",
            "cache_config",
            "scheduler_config",
            "parallel_config",
            "kv_transfer_config",
            "kv_events_config",
            "attention_config",
        ),
        *read(
            "vllm.config:CacheConfig",
            "info.py, releases.py: kv_capacity_tokens()",
            "num_gpu_blocks",
            "block_size",
            "cache_dtype",
        ),
        *read("vllm.config:SchedulerConfig", "info.py", "max_num_seqs"),
        *read(
            "vllm.config:ParallelConfig",
            "info.py, kv_events.py",
            "data_parallel_size",
            "data_parallel_rank",
        ),
        *read("vllm.config:KVTransferConfig", "info.py", "kv_connector", "kv_role", "engine_id"),
        *read("vllm.config:AttentionConfig", "info.py", "backend"),
        *read(
            "vllm.config:KVEventsConfig",
            "kv_events.py: kv_sources()",
            "enable_kv_cache_events",
            "publisher",
            "endpoint",
            "replay_endpoint",
            "topic",
            "hwm",
        ),
        *read(
            "vllm.outputs:RequestOutput",
            "servicer.py: _responses()",
            "prompt_token_ids",
            "num_cached_tokens",
            "outputs",
            "prompt_logprobs",
            "kv_transfer_params",
        ),
        *read(
            "vllm.outputs:CompletionOutput",
            "servicer.py, convert.py",
            "index",
            "token_ids",
            "logprobs",
            "finish_reason",
            "stop_reason",
        ),
        # metrics: the registry vLLM's HTTP server serves (served beside ours on --metrics-port)
        u(f"{stats}.prometheus:get_prometheus_registry", "_engine.py: prometheus_registry()", 0),
        Use(
            "vllm.outputs:CompletionOutput.spec_decode_metrics",
            "convert.py: spec_fields() (GenerateComplete's spec counts)",
            read=True,
            since="0.29.0",
            without="no spec counts (the fields unset)",
        ),
        Use(
            f"{stats}.stats:RequestSpecDecodeMetrics.histogram",
            "convert.py: spec_fields()",
            read=True,
            since="0.29.0",
            without="no spec counts (the fields unset)",
        ),
        Use(
            f"{stats}.stats:RequestSpecDecodeMetrics.num_draft_tokens",
            "convert.py: spec_fields()",
            read=True,
            since="0.29.0",
            without="no spec counts (the fields unset)",
        ),
        *read("vllm.outputs:PoolingRequestOutput", "servicer.py: Embed", "outputs", "finished"),
        *read("vllm.outputs:PoolingOutput", "servicer.py: Embed", "data"),
        *read("vllm.logprobs:Logprob", "convert.py", "logprob", "rank"),
        # a token prompt rendered inline (_engine.py: rendered_tokens(), issue #42)
        Use(f"{llm}.input_processor", "_engine.py: rendered_tokens()", read=True),
        Use(f"{model}.is_encoder_decoder", "_engine.py: rendered_tokens()", read=True),
        Use(
            "vllm.renderers.base:BaseRenderer.default_cmpl_tok_params",
            "_engine.py: rendered_tokens()",
            read=True,
        ),
        u("vllm.renderers.base:BaseRenderer.render_cmpl", "_engine.py: rendered_tokens()", 2),
        u(
            "vllm.renderers.params:TokenizeParams.with_kwargs",
            "_engine.py: rendered_tokens() (sampling.py's tokenization kwargs, as **kwargs: the "
            "dict vLLM's own raw-prompt path hands it)",
            0,
        ),
        # capabilities our code detects (releases.py): the fallbacks are run in check_fallbacks
        Use(
            "vllm.v1.engine.input_processor:InputProcessor.process_inputs_async",
            "_engine.py: rendered_tokens() (AsyncLLM sends a raw prompt through the renderer's "
            "thread pool; its rendered-input branch comes with it)",
            read=True,
            since="0.27.0",
            without="the raw token prompt, which vLLM renders inline itself",
        ),
        Use(
            f"{processor}.get_dummy_inputs",
            "releases.py: dummy_inputs()",
            since="0.31.0",
            without="the dummy builder's get_dummy_processor_inputs",
        ),
        Use(
            f"{model}.supports_multimodal_inputs",
            "releases.py: supports_multimodal_inputs()",
            since="0.31.0",
            without="MultiModalRegistry.supports_multimodal_inputs(model_config)",
        ),
        Use(
            f"{llm}.notify_kv_transfer_request_rejected",
            "releases.py: rejection_notice() (servicer.py: Generate's KV-transfer notice)",
            2,
            frozenset({"data_parallel_rank"}),
            since="0.21.0",
            without="no notice: the release has no way to take one (kv_transfer.py)",
        ),
        Use(
            f"{llm}.get_kv_event_sources",
            "releases.py: kv_event_sources()",
            since="0.31.0",
            without="the configured base port plus the rank (kv_events.py)",
        ),
        Use(
            "vllm.config:CacheConfig.kv_cache_size_tokens",
            "releases.py: kv_capacity_tokens() (GetLoads' capacity)",
            read=True,
            since="0.24.0",
            without="num_gpu_blocks * block_size",
        ),
        Use(
            f"{stats}.stats:SchedulerStats.num_skipped_waiting_reqs",
            "releases.py: waiting_fields() (GetLoads' waiting)",
            read=True,
            since="0.20.0",
            without="num_waiting_reqs alone",
        ),
        # the exceptions errors.py's table names (matched by class name: see check_fallbacks)
        *(
            Use(f"{module}:{name}", "errors.py: the table", since=since, without=_IDLE)
            for name, (module, since, _) in EXCEPTIONS.items()
        ),
        # headless.py: the router's ZMQ lane (vLLM's headless serve, the cores' request guard)
        u(serve, "_engine.py: serve_subcommand()", 0),
        u(f"{serve}.subparser_init", "headless.py: _parser()", 1),
        u(f"{serve}.validate", "headless.py: main(), rust_lane.py: run()", 1),
        # rust_lane.py: the server's model and engine facts, from vLLM's own config
        u("vllm:AsyncEngineArgs", "_engine.py: engine_config()"),
        u("vllm:AsyncEngineArgs.from_cli_args", "_engine.py: engine_config()", 1),
        u("vllm:AsyncEngineArgs.create_engine_config", "_engine.py: engine_config()", 0),
        u(f"{serve}.cmd", "headless.py: run() (runs run_headless for --headless)", 1),
        u("vllm.entrypoints.cli.serve:run_headless", "headless.py: what cmd runs", 1),
        u(f"{core}.preprocess_add_request", "headless.py: guard_engine_core() wraps it", 1),
        u(f"{core}.abort_requests", "headless.py: guard_engine_core() logs the aborts", 1),
        u(f"{core}Proc._handle_request_preproc_error", "headless.py: ends a refused request", 1),
        # headless.py: _guard_decoding() wraps the decoding of a request (its id and client
        # index read by the struct's field order when vLLM's own checks raise while decoding)
        u("vllm.v1.engine:EngineCoreRequest", "_engine.py: request_decoding()"),
        u(f"{core}Proc._handle_shutdown", "headless.py: SIGTERM drains (--shutdown-timeout)", 0),
        u(f"{core}Proc._reject_add_in_shutdown", "headless.py: replaced (an error, not abort)", 1),
        u(f"{core}Proc._send_error_outputs_to_client", "headless.py: the drain's refusal", 2),
        Use("vllm.v1.engine.core:EngineShutdownState.RUNNING", "headless.py", read=True),
        Use(f"{core}Proc.ENGINE_CORE_DEAD", "headless.py: ENGINE_CORE_DEAD", read=True),
        Use(f"{model}.max_model_len", "headless.py: guard_engine_core()", read=True),
        u(f"{model}.get_vocab_size", "headless.py: guard_engine_core()", 0),
        # (and EngineCoreRequest.prompt_token_ids: a list, or from 0.34 an int32 ndarray, which
        # the guard takes both ways; 0.34 declares it under TYPE_CHECKING, out of this reader's
        # sight)
        # the plugin's hooks in vLLM (the launcher itself: check_launcher)
        u("vllm.plugins:load_general_plugins", "plugin.py: loaded by AsyncEngineArgs.add_cli_args"),
        Use("vllm.plugins:DEFAULT_PLUGINS_GROUP", "pyproject.toml: our entry point", read=True),
    ]


_GREEDY = ("max_tokens", "temperature", "ignore_eos")
_IDLE = "nothing raises it: the table's entry never matches"

#: The exception classes :mod:`smg_servicer_vllm.errors` maps, where vLLM defines them, the
#: first release that has them there, and what :func:`errors.translate` must make of them once
#: the request is accepted (None: left alone, core answers INTERNAL).
EXCEPTIONS: dict[str, tuple[str, str, str | None]] = {
    "EngineDeadError": ("vllm.v1.engine.exceptions", "", "Unavailable"),
    "EngineGenerateError": ("vllm.v1.engine.exceptions", "", "(its cause)"),
    "VLLMValidationError": ("vllm.exceptions", "", "InvalidRequest"),
    "VLLMNotFoundError": ("vllm.exceptions", "", "NotFound"),
    "VLLMClientError": ("vllm.exceptions", "0.27.0", "InvalidRequest"),
    "GracefulHTTPError": ("vllm.exceptions", "0.29.0", "Unavailable"),  # built with 503
    "GenerationError": ("vllm.exceptions", "0.29.0", None),
    "RetryableRequestError": ("vllm.exceptions", "0.32.0", "Unavailable"),
}

USES = _uses()

"""What differs between the vLLM releases this package serves (0.19-0.34), in one place.

Every difference is decided by **capability** (a module, keyword or attribute being there), never
by comparing version strings: a release that back-ports or renames something is served by what
it has. Engine-free: nothing here imports vLLM; each check reads the vLLM object the engine
modules (``_engine``, ``_mm_engine``, ``_mm_layouts``) or the duck-typed readers hand it, or the
installed ``vllm`` package's files. Release numbers below say where each capability appears
(``../shared/notes/engine-versions.md`` §1.3-1.4, read from the wheels). Every entry is checked
against each release's published wheel by ``tests/test_release_conformance.py``, which runs
these same functions on what the wheel's sources have.

Each entry: the difference (where it appears) -> the capability read -> what happens without it.

- gRPC launcher module ``vllm.entrypoints.launchers.grpc_server`` (0.30+) -> its file in the
  installed ``vllm`` package (:func:`launcher_module`, deciding by :func:`launcher_for`) ->
  ``vllm.entrypoints.grpc_server`` (0.18-0.29; 0.30+ keep that name as a shim);
- ``MultiModalBudget(vllm_config, registry, *, enable_cache=)`` (0.27+) -> the keyword
  (:func:`keywords`) -> the budget built without it;
- ``renderer.process_for_engine_async(prompt, arrival_time, *, skip_mm_cache=)`` (0.20+) -> the
  keyword -> called without it;
- the multimodal processor's ``get_dummy_inputs(seq_len, counts, options)`` (0.31+; 0.19-0.30
  have ``processor.dummy_inputs.get_dummy_processor_inputs`` with the same arguments, removed in
  0.31) -> the method (:func:`dummy_inputs`) -> the dummy builder's;
- ``ModelConfig.supports_multimodal_inputs`` (0.31+, a property; 0.19-0.30 have
  ``MultiModalRegistry.supports_multimodal_inputs(model_config)``, removed in 0.31) -> the
  property (:func:`supports_multimodal_inputs`) -> the registry's method (without it, every
  model was taken for a text model on 0.19-0.30: found reading the wheels);
- ``AsyncLLM.get_kv_event_sources()`` (0.31+) -> the method (:func:`kv_event_sources`) -> the
  configured base port plus the rank (:mod:`.kv_events`);
- exceptions: ``VLLMClientError`` (0.27+), ``GracefulHTTPError`` in ``vllm.exceptions`` (0.29+),
  ``GenerationError`` (0.29+), ``RetryableRequestError`` (0.32+) -> matched by class *name*
  along the MRO, wherever vLLM defines them (:mod:`.errors`) -> a bare ``ValueError`` or
  ``TypeError`` while the request is built is still INVALID_ARGUMENT;
- the launcher's keepalive options, misspelt on 0.18-0.30 -> the options the server is built
  with (:func:`.plugin.fix_keepalive` adds only those it lacks) -> -;
- ``CacheConfig.kv_cache_size_tokens`` (0.24+; group-aware, set once the KV cache is sized) ->
  the attribute, set (:func:`kv_capacity_tokens`) -> ``num_gpu_blocks * block_size``, which is
  wrong for hybrid models whose requests occupy several KV-cache groups;
- ``SchedulerStats.num_skipped_waiting_reqs`` (0.20+; waiting requests deferred by transient
  constraints or a blocked status, left out of ``num_waiting_reqs``; vLLM's own stats logging
  counts ``num_waiting_reqs + num_skipped_waiting_reqs`` as waiting) -> the field
  (:func:`waiting_fields`) -> ``num_waiting_reqs`` alone, what vLLM reports as waiting there;
- ``AsyncLLM.get_num_unfinished_requests()`` (0.29+) -> not needed: we read
  ``output_processor.get_num_unfinished_requests()``, there in every release;
- ``AsyncLLM.notify_kv_transfer_request_rejected`` (0.21+) -> :func:`rejection_notice` -> none: a
  release before it has no way to take the notice (:mod:`.kv_transfer`);
- ``grpc.health.v1`` registered by the launcher (0.20+) -> nothing to detect: on 0.18-0.19 our
  servicer's own ``HealthCheck`` RPC still answers.

Not used by this package, so no release lacks them for us: per-request
``SamplingParams.stream_interval`` (0.27+), ``process_for_engine_async(tok_params=)`` (0.31+),
``CompletionOutput.spec_decode_metrics`` (0.29+).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: vLLM's gRPC launcher stops its server with this grace once it has called ``set_not_serving``
#: (``server.stop(grace=5.0)``; 0.34's ``_RPC_GRACE_S``).
LAUNCHER_GRACE_S = 5.0
#: What 0.34's drain (``--shutdown-timeout`` above 0) adds after the RPCs' grace: the engine's
#: teardown and the last RPC flush (``_ENGINE_TEARDOWN_S + _RPC_FLUSH_S``).
LAUNCHER_DRAIN_EXTRA_S = 10.0


def launcher_stop_s(shutdown_timeout: float) -> float:
    """The longest vLLM's gRPC launcher takes to stop after ``set_not_serving``: its fixed grace
    (0.19-0.33; 0.34 with ``--shutdown-timeout 0``), or 0.34's drain, ``max(--shutdown-timeout,
    grace)`` plus teardown and flush. Not decided by release: before 0.34 the flag exists but
    only the HTTP server honours it, so there the longer bound only lengthens the safety net
    (the stop deadline, :func:`.plugin.shutdown_deadline`)."""
    if shutdown_timeout <= 0:
        return LAUNCHER_GRACE_S
    return max(float(shutdown_timeout), LAUNCHER_GRACE_S) + LAUNCHER_DRAIN_EXTRA_S


#: vLLM's gRPC launcher module: the current name (0.30+) first, then the one before (0.18-0.29).
LAUNCHER_MODULES = ("vllm.entrypoints.launchers.grpc_server", "vllm.entrypoints.grpc_server")
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def launcher_module() -> str:
    """The installed vLLM's gRPC launcher module (``python -m <it>``), found without importing
    vLLM (:func:`launcher_for` over the installed package's files); the current name when no
    vLLM is installed."""
    spec = importlib.util.find_spec("vllm")  # a top-level name: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return LAUNCHER_MODULES[0]
    locations = [Path(location) for location in spec.submodule_search_locations]

    def exists(module: str) -> bool:
        relative = Path(*module.split(".")[1:])
        return any(
            (folder / relative).with_suffix(".py").is_file()
            or (folder / relative / "__init__.py").is_file()
            for folder in locations
        )

    return launcher_for(exists)


def launcher_for(module_exists: Callable[[str], bool]) -> str:
    """The launcher module of a vLLM release whose modules are ``module_exists`` (a dotted
    name -> is it in the release): the current name when that module is there, else the old
    one. Pure: the installed package (:func:`launcher_module`) and a release's wheel (the
    conformance test) are asked the same way."""
    return LAUNCHER_MODULES[0] if module_exists(LAUNCHER_MODULES[0]) else LAUNCHER_MODULES[1]


@functools.cache
def _named_parameters(call: Any) -> frozenset[str]:
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: assume nothing
        return frozenset()
    return frozenset(p.name for p in parameters if p.kind in _NAMED)


def accepts(call: Any, keyword: str) -> bool:
    """``call`` (a function, a bound method or a class) takes ``keyword`` by name; ``**kwargs``
    alone does not count (it may forward the keyword to something that lacks it)."""
    return keyword in _named_parameters(getattr(call, "__func__", call))


def keywords(call: Any, **wanted: Any) -> dict[str, Any]:
    """The subset of ``wanted`` that ``call`` accepts: ``call(*args, **keywords(call, x=1))``
    passes ``x`` only to a release that has it."""
    return {name: value for name, value in wanted.items() if accepts(call, name)}


def dummy_inputs(processor: Any) -> Any:
    """The multimodal processor's builder of dummy inputs, ``(seq_len, counts, options) ->
    ProcessorInputs``: the processor's own method where it has one, else its dummy builder's."""
    method: Any = getattr(processor, "get_dummy_inputs", None)
    if callable(method):
        return method
    return processor.dummy_inputs.get_dummy_processor_inputs


def rejection_notice(engine: Any) -> Callable[..., Any] | None:
    """``AsyncLLM.notify_kv_transfer_request_rejected`` (0.21+), or None before it."""
    notify: Any = getattr(engine, "notify_kv_transfer_request_rejected", None)
    return notify if callable(notify) else None


def kv_event_sources(engine: Any) -> dict[int, Any]:
    """The KV-event publishers the engine reports per DP rank (``get_kv_event_sources()``, 0.31+),
    or ``{}`` when it cannot say: the caller then derives each rank's endpoints from the
    configured base port plus the rank, as vLLM binds them."""
    getter: Any = getattr(engine, "get_kv_event_sources", None)
    if not callable(getter):
        return {}
    try:
        reported: Any = getter()
        return {int(k): v for k, v in dict(reported).items()}
    except Exception:  # an engine that cannot report yet: derive the endpoints
        return {}


def supports_multimodal_inputs(model_config: Any, registry: Any) -> bool:
    """The model takes multimodal input (a multimodal model with a modality not limited to 0):
    ``ModelConfig.supports_multimodal_inputs`` (0.31+, a property) where the configuration has
    it, else the registry's ``supports_multimodal_inputs(model_config)`` (0.19-0.30; removed in
    0.31). A configuration that is not a multimodal model's is never asked further."""
    own: Any = getattr(model_config, "supports_multimodal_inputs", None)
    if own is not None:
        return bool(own() if callable(own) else own)
    if not getattr(model_config, "is_multimodal_model", False):
        return False
    check: Any = getattr(registry, "supports_multimodal_inputs", None)
    return bool(check(model_config)) if callable(check) else False


def kv_capacity_tokens(cache_config: Any) -> int | None:
    """The KV cache's capacity in tokens, per DP engine, as the engine sizes it:
    ``CacheConfig.kv_cache_size_tokens`` (0.24+, group-aware; None until the KV cache is sized)
    where the release has it and it is set, else ``num_gpu_blocks * block_size`` (what 0.19-0.23
    have; for a hybrid model, whose requests occupy several KV-cache groups, it overstates the
    tokens that fit). None when neither is known, or what is there is not a count."""
    sized: Any = getattr(cache_config, "kv_cache_size_tokens", None)
    if sized is not None:
        return sized if _is_count(sized) else None
    blocks: Any = getattr(cache_config, "num_gpu_blocks", None)
    block_size: Any = getattr(cache_config, "block_size", None)
    if not (_is_count(blocks) and _is_count(block_size)):
        return None
    return int(blocks) * int(block_size)


#: ``SchedulerStats`` fields whose sum is a rank's waiting requests: :func:`waiting_fields`.
WAITING = "num_waiting_reqs"
SKIPPED_WAITING = "num_skipped_waiting_reqs"


def waiting_fields(scheduler_stats: Any) -> tuple[str, ...]:
    """The ``SchedulerStats`` fields that add up to a rank's waiting requests, as vLLM's own stats
    logging and Prometheus gauge count them: ``num_waiting_reqs`` plus
    ``num_skipped_waiting_reqs`` (0.20+: the waiting requests the scheduler deferred, which
    ``num_waiting_reqs`` leaves out) where the release's stats have it, else
    ``num_waiting_reqs`` alone (0.19: what vLLM itself reports as waiting there). Without the
    second, a rank whose queue is all deferred requests read as having none waiting."""
    if hasattr(scheduler_stats, SKIPPED_WAITING):
        return (WAITING, SKIPPED_WAITING)
    return (WAITING,)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

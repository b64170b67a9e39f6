"""GetModelInfo / GetServerInfo / GetLoads from the engine's configuration and statistics.

Duck-typed over vLLM's ``AsyncLLM`` (``model_config``, ``vllm_config``, ``logger_manager``,
``engine_core``, ``output_processor``), read leniently: a field a vLLM version lacks is left at its
proto default. Except a rank's load: ``GetLoads`` reports a DP rank only from stats it can trust
(:func:`rank_counts`), and leaves out a rank without them instead of reporting it idle.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from smg_servicer_core.config import Setting, setting_value
from smg_servicer_core.errors import InvalidRequest, Unavailable
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.loads import LoadSnapshot
from smg_servicer_core.metrics import EngineLoad, rank_loads
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm import kv_transfer, releases

SERVER_TYPE = "vllm-grpc"
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_DEFAULT_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
PAIRING_PROTOCOL = Setting(
    "pairing_protocol",
    str.strip,
    "",
    "the PD pairing protocol GetServerInfo advertises",
    env="SMG_PAIRING_PROTOCOL",
)


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return default
    return obj


def _eos_ids(hf_config: Any) -> list[int]:
    value = getattr(hf_config, "eos_token_id", None)
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple):
        return [int(v) for v in value if isinstance(v, int)]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return []


def default_sampling(model_config: Any) -> dict[str, Any]:
    getter: Any = getattr(model_config, "get_diff_sampling_param", None)
    params: Mapping[str, Any] = {}
    try:
        if callable(getter):
            params = cast(Mapping[str, Any], getter())
    except Exception:  # a generation_config.json vLLM cannot read: advertise nothing
        params = {}
    return {k: params[k] for k in _DEFAULT_SAMPLING_KEYS if k in params}


def model_facts(engine: Any) -> ModelFacts:
    mc = engine.model_config
    hf = getattr(mc, "hf_config", None)
    served = getattr(mc, "served_model_name", None) or mc.model
    if isinstance(served, list | tuple):
        served = served[0]  # pyright: ignore[reportUnknownVariableType]
    return ModelFacts(
        model_path=str(mc.model),
        vocab_size=int(mc.get_vocab_size()),
        max_context_length=int(getattr(mc, "max_model_len", 0) or 0),
        is_generation=getattr(mc, "runner_type", "generate") == "generate",
        supports_vision=bool(getattr(mc, "is_multimodal_model", False)),
        served_model_name=str(served),  # pyright: ignore[reportUnknownArgumentType]
        tokenizer_path=str(getattr(mc, "tokenizer", "") or ""),
        model_type=str(getattr(hf, "model_type", "") or ""),
        architectures=tuple(getattr(hf, "architectures", None) or ()),
        eos_token_ids=tuple(_eos_ids(hf)),
        pad_token_id=int(getattr(hf, "pad_token_id", 0) or 0),
        bos_token_id=int(getattr(hf, "bos_token_id", 0) or 0),
        default_sampling_params=default_sampling(mc),
    )


def _kv_transfer(vc: Any) -> tuple[str, str, str]:
    kv = _get(vc, "kv_transfer_config")
    if kv is None:
        return "", "", ""
    return (
        kv_transfer.reported_connector(kv),  # a MultiConnector: the child that moves the KV
        str(getattr(kv, "kv_role", "") or ""),
        str(getattr(kv, "engine_id", "") or ""),
    )


#: How long ``GetServerInfo`` waits for the engine core to say whether it is paused.
PAUSE_PROBE_TIMEOUT_S = 2.0


async def is_paused(engine: Any) -> bool:
    """The engine's own pause state (``AsyncLLM.is_paused``: ``pause_generation`` until
    ``resume_generation``), asked of the engine core; False for an engine without one. An engine
    core that does not answer within :data:`PAUSE_PROBE_TIMEOUT_S` is UNAVAILABLE, not
    reported as serving."""
    probe: Callable[[], Awaitable[Any]] | None = getattr(engine, "is_paused", None)
    if probe is None:
        return False
    try:
        return bool(await asyncio.wait_for(probe(), PAUSE_PROBE_TIMEOUT_S))
    except TimeoutError:
        raise Unavailable(
            f"the engine did not say within {PAUSE_PROBE_TIMEOUT_S:g} s whether it is paused"
        ) from None


def reasoning(vllm_config: Any) -> tuple[str, str]:
    """(``engine_reasoning_parser``, ``constrained_decoding_start``) from the structured outputs
    config: the parser's name ("" for none), and "after_reasoning" when a parser is set and
    ``enable_in_reasoning`` is off (the grammar waits for the thought's end), "first_token"
    otherwise; ("", "") when the config does not say (a vLLM without it)."""
    so = _get(vllm_config, "structured_outputs_config")
    if so is None or not hasattr(so, "reasoning_parser"):
        return "", ""
    parser = str(getattr(so, "reasoning_parser", "") or "")
    waits = bool(parser) and not bool(getattr(so, "enable_in_reasoning", False))
    return parser, "after_reasoning" if waits else "first_token"


def server_info(engine: Any, active: int, uptime_s: float) -> pb.GetServerInfoResponse:
    vc = engine.vllm_config
    parser, grammar_start = reasoning(vc)
    connector, role, engine_id = _kv_transfer(vc)
    dtype = str(_get(vc, "model_config", "dtype", default=""))
    encoder_dtype = dtype.removeprefix("torch.")
    return pb.GetServerInfoResponse(
        active_requests=active,
        uptime_seconds=uptime_s,
        server_type=SERVER_TYPE,
        kv_connector=connector,
        kv_role=role,
        kv_engine_id=engine_id,
        data_parallel_size=int(_get(vc, "parallel_config", "data_parallel_size", default=1)),
        kv_cache_dtype=str(_get(vc, "cache_config", "cache_dtype", default="")),
        block_size=int(_get(vc, "cache_config", "block_size", default=0)),
        attention_backend=str(_get(vc, "attention_config", "backend", default="") or ""),
        model_dtype=dtype,
        pairing_protocol=setting_value(PAIRING_PROTOCOL),
        max_num_seqs=int(_get(vc, "scheduler_config", "max_num_seqs", default=0)),
        multimodal_encoder_dtype=(
            encoder_dtype if encoder_dtype in ("float32", "float16", "bfloat16") else ""
        ),
        engine_reasoning_parser=parser,
        constrained_decoding_start=grammar_start,
    )


def managed_ranks(engine: Any) -> list[int]:
    """The DP ranks this engine's frontend manages, ascending: the stat logger manager's
    ``engine_indexes`` (the ranks vLLM records stats for), else the engine client's
    ``engine_ranks_managed`` (``--disable-log-stats`` keeps no stat logger manager), else, with one
    DP rank, the configuration's ``data_parallel_rank``; else none. Under external or hybrid load
    balancing a process manages a slice of ``data_parallel_size`` ranks, so the configured size
    does not say which ranks are ours."""
    for owner, name in (
        ("logger_manager", "engine_indexes"),
        ("engine_core", "engine_ranks_managed"),
    ):
        listed: Any = _get(engine, owner, name)
        if isinstance(listed, list | tuple | range):
            ranks = sorted({r for r in cast(Iterable[Any], listed) if _is_int32(r) and r >= 0})
            if ranks:
                return ranks
    parallel = _get(engine, "vllm_config", "parallel_config")
    if getattr(parallel, "data_parallel_size", 1) == 1:
        rank: Any = getattr(parallel, "data_parallel_rank", 0)
        if _is_int32(rank) and rank >= 0:
            return [rank]
    return []


def scheduler_stats(engine: Any) -> dict[int, Any]:
    """The latest ``SchedulerStats`` per DP rank, from whichever stat loggers hold them:
    ``AggregatedLoggingStatLogger.last_scheduler_stats_dict`` (``--aggregate-engine-logging``;
    its own ``last_scheduler_stats`` is the ranks' sum), the ``LoggingStatLogger`` of each rank in
    ``PerEngineStatLoggerAdapter.per_engine_stat_loggers`` (the default), or a logger keeping one
    rank's (``last_scheduler_stats`` with its ``engine_index``). Prometheus keeps none. Empty
    without a stat logger manager (``--disable-log-stats``)."""
    found: dict[int, Any] = {}

    def keep(rank: Any, stats: Any) -> None:
        if _is_int32(rank) and rank >= 0 and stats is not None:
            found.setdefault(rank, stats)

    for stat_logger in _get(engine, "logger_manager", "stat_loggers", default=[]):
        per_rank: Any = getattr(stat_logger, "last_scheduler_stats_dict", None)
        if isinstance(per_rank, dict):
            for rank, stats in cast(dict[Any, Any], per_rank).items():
                keep(rank, stats)
            continue
        per_engine: Any = getattr(stat_logger, "per_engine_stat_loggers", None)
        if isinstance(per_engine, dict):
            for rank, nested in cast(dict[Any, Any], per_engine).items():
                keep(rank, getattr(nested, "last_scheduler_stats", None))
            continue
        keep(
            getattr(stat_logger, "engine_index", None),
            getattr(stat_logger, "last_scheduler_stats", None),
        )
    return found


def _is_int32(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and _INT32_MIN <= value <= _INT32_MAX
    )


def _count(value: Any) -> int | None:
    """``value`` as a count the wire carries (an int32, not negative), or None."""
    return value if _is_int32(value) and value >= 0 else None


def rank_counts(stats: Any) -> tuple[int, int, float] | None:
    """A rank's running and waiting requests and KV-cache usage from its ``SchedulerStats``, or
    None when there is nothing trustworthy to report: no stats, or a count that is not a
    non-negative int32, or a usage that is not a finite number in [0, 1]. Such a rank is left out
    of the answer rather than reported idle: a zero-filled entry sends the router's next requests
    to a rank it knows nothing about. Waiting counts the fields :func:`releases.waiting_fields`
    names (the deferred requests too, where the release counts them apart)."""
    if stats is None:
        return None
    running = _count(getattr(stats, "num_running_reqs", None))
    parts = [_count(getattr(stats, name, None)) for name in releases.waiting_fields(stats)]
    usage: Any = getattr(stats, "kv_cache_usage", None)
    if running is None or None in parts:
        return None
    if not isinstance(usage, int | float) or isinstance(usage, bool):
        return None
    if not (math.isfinite(usage) and 0.0 <= usage <= 1.0):
        return None
    waiting = sum(p for p in parts if p is not None)
    if running + waiting > _INT32_MAX:
        return None
    return running, waiting, float(usage)


def loads(
    engine: Any, snapshot: LoadSnapshot, dp_rank: int | None, version: str
) -> pb.GetLoadsResponse:
    """``GetLoads``: one ``SchedulerLoad`` per managed DP rank (:func:`managed_ranks`) whose
    stats can be trusted (:func:`rank_counts`), only ``dp_rank``'s when it is given; a rank
    without them is left out, never zero-filled. Capacity is the engine's
    (:func:`releases.kv_capacity_tokens`, 0 when unknown). ``dp_rank_count`` is the number of
    entries, as the proto says ("ranks reported") and the SGLang and TokenSpeed servicers fill
    it. Raises :class:`InvalidRequest` for a ``dp_rank`` this engine does not manage.

    A rank's stats are those of its last step, and an idle engine takes no step: after the last
    request was aborted (vLLM drops it without a step), or before the last step's stats are
    recorded, they still count it running. So when the frontend holds no unfinished request,
    every rank it manages is idle: nothing running or waiting and no KV block in use (vLLM
    counts blocks kept only for the prefix cache as free)."""
    ranks = managed_ranks(engine)
    if dp_rank is not None:
        if dp_rank not in ranks:
            raise InvalidRequest(f"DP rank {dp_rank} is not managed by this engine")
        ranks = [dp_rank]
    vc = engine.vllm_config
    capacity = _count(releases.kv_capacity_tokens(_get(vc, "cache_config"))) or 0
    max_seqs = _count(_get(vc, "scheduler_config", "max_num_seqs")) or 0
    stats = scheduler_stats(engine)
    idle = _unfinished(engine) == 0
    response = pb.GetLoadsResponse(timestamp=datetime.now(UTC).isoformat(), version=version)
    for rank in ranks:
        counts = rank_counts(stats.get(rank))
        if counts is None:
            continue
        running, waiting, usage = (0, 0, 0.0) if idle else counts
        response.loads.add(
            dp_rank=rank,
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            num_total_reqs=running + waiting,
            num_used_tokens=round(usage * capacity),
            max_total_num_tokens=capacity,
            token_usage=usage,
            utilization=usage,
            gen_throughput=snapshot.gen_throughput,
            cache_hit_rate=snapshot.cache_hit_rate,
            max_running_requests=max_seqs,
        )
    response.dp_rank_count = len(response.loads)
    return response


def _unfinished(engine: Any) -> int | None:
    """The requests the frontend holds unfinished (None when it cannot tell)."""
    count: Any = _get(engine, "output_processor", "get_num_unfinished_requests")
    if not callable(count):
        return None
    value: Any = count()
    return int(value)


def engine_load(engine: Any, response: pb.GetLoadsResponse) -> list[EngineLoad]:
    """The engine gauges of ``/metrics``: each rank ``GetLoads`` reports. Without a stat logger
    manager (``--disable-log-stats``, as the launcher command of our tests runs) ``GetLoads``
    reports no rank; the gauges then show what the frontend knows, for no rank in particular
    (``dp_rank`` ""): its unfinished requests as running (waiting and usage unknown: 0), so that
    ``/metrics`` still tells whether the engine holds requests (the reliability suite's leak
    check reads it). The router never sees these: they are not a ``GetLoads`` entry."""
    if response.loads:
        return rank_loads(response.loads)
    if _get(engine, "logger_manager") is not None:
        return []
    unfinished = _unfinished(engine)
    if unfinished is None:
        return []
    return [EngineLoad(running=unfinished, waiting=0, kv_cache_usage=0.0, dp_rank=None)]

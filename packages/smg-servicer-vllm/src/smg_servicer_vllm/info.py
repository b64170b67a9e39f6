"""GetModelInfo / GetServerInfo / GetLoads from the engine's configuration and statistics.

Duck-typed over vLLM's ``AsyncLLM`` (``model_config``, ``vllm_config``, ``logger_manager``,
``output_processor``), read leniently: a field a vLLM version lacks is left at its proto default.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from smg_servicer_core.config import Setting, setting_value
from smg_servicer_core.facts import ModelFacts
from smg_servicer_core.loads import LoadSnapshot
from smg_servicer_core.metrics import EngineLoad
from smg_servicer_core.proto import vllm_engine_pb2 as pb

SERVER_TYPE = "vllm-grpc"
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
        str(getattr(kv, "kv_connector", "") or ""),
        str(getattr(kv, "kv_role", "") or ""),
        str(getattr(kv, "engine_id", "") or ""),
    )


def server_info(engine: Any, active: int, uptime_s: float) -> pb.GetServerInfoResponse:
    vc = engine.vllm_config
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
    )


def scheduler_stats(engine: Any) -> dict[int, Any]:
    """The latest ``SchedulerStats`` per DP rank, from whichever stat loggers hold them."""
    found: dict[int, Any] = {}
    for stat_logger in _get(engine, "logger_manager", "stat_loggers", default=[]):
        per_rank = getattr(stat_logger, "last_scheduler_stats_dict", None)
        if isinstance(per_rank, dict):
            found.update(per_rank)  # pyright: ignore[reportUnknownArgumentType]
            continue
        stats = getattr(stat_logger, "last_scheduler_stats", None)
        if stats is not None:
            found.setdefault(max(int(getattr(stat_logger, "engine_index", 0) or 0), 0), stats)
    return found


def loads(
    engine: Any, snapshot: LoadSnapshot, dp_rank: int | None, version: str
) -> pb.GetLoadsResponse:
    vc = engine.vllm_config
    block_size = int(_get(vc, "cache_config", "block_size", default=0))
    blocks = int(_get(vc, "cache_config", "num_gpu_blocks", default=0) or 0)
    capacity = blocks * block_size
    max_seqs = int(_get(vc, "scheduler_config", "max_num_seqs", default=0))
    ranks = int(_get(vc, "parallel_config", "data_parallel_size", default=1))
    stats = scheduler_stats(engine)
    if not stats:  # no stat logger (--disable-log-stats): what the frontend knows
        running = int(engine.output_processor.get_num_unfinished_requests())
        stats = {0: None}
        fallback_running = running
    else:
        fallback_running = 0
    response = pb.GetLoadsResponse(
        timestamp=datetime.now(UTC).isoformat(), version=version, dp_rank_count=ranks
    )
    for rank in sorted(stats):
        if dp_rank is not None and rank != dp_rank:
            continue
        s = stats[rank]
        usage = float(getattr(s, "kv_cache_usage", 0.0) or 0.0)
        running = int(getattr(s, "num_running_reqs", fallback_running) or 0)
        waiting = int(getattr(s, "num_waiting_reqs", 0) or 0)
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
    return response


def engine_load(response: pb.GetLoadsResponse) -> EngineLoad | None:
    """The engine gauges of ``/metrics``: running and waiting summed over ranks, KV usage the
    highest rank's."""
    if not response.loads:
        return None
    return EngineLoad(
        running=sum(r.num_running_reqs for r in response.loads),
        waiting=sum(r.num_waiting_reqs for r in response.loads),
        kv_cache_usage=max(r.token_usage for r in response.loads),
    )

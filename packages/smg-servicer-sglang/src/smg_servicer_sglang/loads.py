"""GetLoads from the schedulers' ``LoadSnapshot`` records (SGLang's shared-memory slots)."""

from __future__ import annotations

from typing import Any

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb

SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def sections(include: list[str]) -> frozenset[str]:
    """The requested sections (default: all); an unknown name is INVALID_ARGUMENT."""
    chosen = frozenset(include or ["all"])
    unknown = chosen - SECTIONS
    if unknown:
        raise InvalidRequest(
            f"unknown GetLoads section(s) {sorted(unknown)}; valid: {sorted(SECTIONS)}"
        )
    return SECTIONS if "all" in chosen else chosen


def read(reader: Any) -> list[Any]:
    """Every rank's latest snapshot (blocking: a file lock; call off the loop)."""
    if reader is None:
        return []
    return sorted(reader.read_all(), key=lambda s: int(s.dp_rank))


def read_rank(reader: Any, rank: int) -> Any:
    if reader is None:
        return None
    return reader.read(rank)


def scheduler_load(snapshot: Any, include: frozenset[str]) -> pb.SchedulerLoad:
    s = snapshot
    load = pb.SchedulerLoad(
        dp_rank=int(s.dp_rank),
        num_running_reqs=int(s.num_running_reqs),
        num_waiting_reqs=int(s.num_waiting_reqs),
        num_total_reqs=int(s.num_running_reqs) + int(s.num_waiting_reqs),
        num_used_tokens=int(s.num_used_tokens),
        max_total_num_tokens=int(s.max_total_num_tokens),
        token_usage=float(s.token_usage),
        gen_throughput=float(s.gen_throughput),
        cache_hit_rate=float(s.cache_hit_rate),
        utilization=float(s.utilization),
        max_running_requests=int(s.max_running_requests),
        num_waiting_uncached_tokens=int(s.num_waiting_uncached_tokens),
    )
    if "memory" in include and s.memory is not None:
        m = s.memory
        load.memory.CopyFrom(
            pb.MemoryMetrics(
                weight_gb=m.weight_gb,
                kv_cache_gb=m.kv_cache_gb,
                graph_gb=m.graph_gb,
                token_capacity=m.token_capacity,
            )
        )
    if "spec" in include and s.speculative is not None:
        load.speculative.CopyFrom(
            pb.SpeculativeMetrics(
                accept_length=s.speculative.accept_length, accept_rate=s.speculative.accept_rate
            )
        )
    if "lora" in include and s.lora is not None:
        load.lora.CopyFrom(
            pb.LoRAMetrics(
                slots_used=s.lora.slots_used,
                slots_total=s.lora.slots_total,
                utilization=s.lora.utilization,
            )
        )
    if "disagg" in include and s.disaggregation is not None:
        d = s.disaggregation
        load.disaggregation.CopyFrom(
            pb.DisaggregationMetrics(
                mode=d.mode,
                prefill_prealloc_queue_reqs=d.prefill_bootstrap_queue_reqs,
                prefill_inflight_queue_reqs=d.prefill_inflight_queue_reqs,
                decode_prealloc_queue_reqs=d.decode_prealloc_queue_reqs,
                decode_transfer_queue_reqs=d.decode_transfer_queue_reqs,
                decode_retracted_queue_reqs=d.decode_retracted_queue_reqs,
                kv_transfer_speed_gb_s=d.kv_transfer_speed_gb_s,
                kv_transfer_latency_ms=d.kv_transfer_latency_ms,
            )
        )
    if "queues" in include and s.queues is not None:
        q = s.queues
        load.queues.CopyFrom(
            pb.QueueMetrics(
                waiting=q.waiting, grammar=q.grammar, paused=q.paused, retracted=q.retracted
            )
        )
    return load


def aggregate(rows: list[pb.SchedulerLoad]) -> pb.AggregateMetrics:
    """Totals over ranks, and averages rounded as SGLang's /v1/loads does (4/2/4 digits)."""
    if not rows:
        return pb.AggregateMetrics()
    count = len(rows)
    return pb.AggregateMetrics(
        total_running_reqs=sum(r.num_running_reqs for r in rows),
        total_waiting_reqs=sum(r.num_waiting_reqs for r in rows),
        total_reqs=sum(r.num_total_reqs for r in rows),
        avg_token_usage=round(sum(r.token_usage for r in rows) / count, 4),
        avg_throughput=round(sum(r.gen_throughput for r in rows) / count, 2),
        avg_utilization=round(sum(r.utilization for r in rows) / count, 4),
    )

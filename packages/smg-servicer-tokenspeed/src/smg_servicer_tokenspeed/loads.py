"""``GetLoads`` from TokenSpeed's load snapshots, pure.

Each scheduler rank publishes a ``LoadSnapshot`` (running and waiting requests, KV pages: active,
used, total); the front end keeps the newest fresh one per rank. A partial set (a rank silent or
stale) reports no loads at all rather than a misleading subset. Token counts are pages scaled to
the KV capacity the scheduler reported at start (``max_total_num_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb


def scheduler_load(snapshot: Any, capacity: int, max_running: int) -> pb.SchedulerLoad:
    pages = max(int(snapshot.max_total_pages), 0)
    used = max(int(snapshot.num_used_pages), 0)
    active = max(int(snapshot.num_active_pages), 0)
    running = max(int(snapshot.num_running_reqs), 0)
    waiting = max(int(snapshot.num_waiting_reqs), 0)
    return pb.SchedulerLoad(
        dp_rank=int(snapshot.dp_rank),
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_total_reqs=running + waiting,
        num_used_tokens=used * capacity // pages if pages else 0,
        max_total_num_tokens=capacity,
        max_running_requests=max_running,
        token_usage=round(used / pages, 4) if pages else 0.0,
        active_token_usage=round(active / pages, 4) if pages else 0.0,
    )


def rows(
    snapshots: Sequence[Any], ranks: int, capacity: int, max_num_seqs: int, rank: int | None
) -> list[pb.SchedulerLoad]:
    """One row per rank (or the one ``rank``), or none when a rank's snapshot is missing."""
    if len({s.dp_rank for s in snapshots}) < ranks:
        return []
    per_rank = max_num_seqs // max(ranks, 1)
    return [scheduler_load(s, capacity, per_rank) for s in snapshots if rank in (None, s.dp_rank)]


def aggregate(loads: Sequence[pb.SchedulerLoad]) -> pb.AggregateMetrics:
    if not loads:
        return pb.AggregateMetrics()
    return pb.AggregateMetrics(
        total_running_reqs=sum(r.num_running_reqs for r in loads),
        total_waiting_reqs=sum(r.num_waiting_reqs for r in loads),
        total_reqs=sum(r.num_total_reqs for r in loads),
        avg_token_usage=round(sum(r.token_usage for r in loads) / len(loads), 4),
    )

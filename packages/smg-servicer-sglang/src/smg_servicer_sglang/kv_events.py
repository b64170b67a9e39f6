"""SGLang's ``--kv-events-config`` -> the bridge's sources, and the engine-load record.

SGLang publishes KV events over ZMQ when started with
``--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'``; each attention-DP rank binds the port plus its rank.
"""

from __future__ import annotations

from typing import Any

from smg_servicer_core.proto import common_pb2
from smg_servicer_kv_bridge import KvSource
from smg_servicer_kv_bridge.config import parse_config
from smg_servicer_kv_bridge.endpoints import dialable, offset

__all__ = ["engine_load", "kv_sources", "parse_config"]


def kv_sources(server_args: Any, ranks: int) -> list[KvSource] | None:
    """One source per DP rank, or None when SGLang publishes no ZMQ KV events."""
    config = parse_config(getattr(server_args, "kv_events_config", None))
    if not config or config.get("publisher") != "zmq":
        return None
    endpoint = str(config.get("endpoint") or "tcp://*:5557")
    replay = config.get("replay_endpoint")
    return [
        KvSource(
            rank=rank,
            endpoint=dialable(offset(endpoint, rank)),
            replay_endpoint=dialable(offset(str(replay), rank)) if replay else None,
            topic=str(config.get("topic") or "").encode(),
            hwm=int(config.get("hwm") or 100_000),
        )
        for rank in range(max(ranks, 1))
    ]


def engine_load(snapshot: Any) -> common_pb2.EngineLoad:
    """The ``EngineLoad`` record stamped on KV batches, from a scheduler ``LoadSnapshot``."""
    record = common_pb2.EngineLoad(
        running_requests=max(int(snapshot.num_running_reqs), 0),
        waiting_requests=max(int(snapshot.num_waiting_reqs), 0),
        token_usage=float(snapshot.token_usage),
        gen_throughput=float(snapshot.gen_throughput),
        max_running_requests=max(int(snapshot.max_running_requests), 0),
        cache_hit_rate=float(snapshot.cache_hit_rate),
        num_used_tokens=max(int(snapshot.num_used_tokens), 0),
        max_total_num_tokens=max(int(snapshot.max_total_num_tokens), 0),
    )
    record.waiting_uncached_tokens = max(int(snapshot.num_waiting_uncached_tokens), 0)
    return record

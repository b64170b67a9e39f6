"""TokenSpeed's ``--kv-events-config`` -> the bridge's sources, pure.

TokenSpeed publishes KV events over ZMQ when started with ``--kv-events-config
'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'`` (a JSON string; an unset publisher means ZMQ once events are
enabled); each attention-DP rank binds the port plus its rank.
"""

from __future__ import annotations

from typing import Any

from smg_servicer_core.proto import common_pb2
from smg_servicer_kv_bridge import KvSource
from smg_servicer_kv_bridge.config import parse_config
from smg_servicer_kv_bridge.endpoints import dialable, offset

__all__ = ["engine_load", "kv_sources", "parse_config"]

OFF = (
    "KV events are off: start TokenSpeed with --kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\' '
    "to enable them; the router falls back to GetLoads"
)


def kv_sources(raw: object, ranks: int) -> list[KvSource] | None:
    """One source per attention-DP rank, or None when TokenSpeed publishes no ZMQ KV events."""
    config = parse_config(raw)
    if not config or not config.get("enable_kv_cache_events"):
        return None
    if config.get("publisher") not in (None, "zmq"):
        return None
    endpoint, topic = config.get("endpoint", "tcp://*:5557"), config.get("topic", "")
    if not isinstance(endpoint, str) or not isinstance(topic, str):
        return None
    replay = config.get("replay_endpoint")
    return [
        KvSource(
            rank=rank,
            endpoint=dialable(offset(endpoint, rank)),
            replay_endpoint=dialable(offset(replay, rank)) if isinstance(replay, str) else None,
            topic=topic.encode(),
            hwm=int(config.get("hwm") or 100_000),
        )
        for rank in range(max(ranks, 1))
    ]


def engine_load(snapshot: Any, capacity: int) -> common_pb2.EngineLoad:
    """The ``EngineLoad`` record stamped on KV batches, from one rank's load snapshot."""
    pages = max(int(snapshot.max_total_pages), 0)
    used = max(int(snapshot.num_used_pages), 0)
    return common_pb2.EngineLoad(
        running_requests=max(int(snapshot.num_running_reqs), 0),
        waiting_requests=max(int(snapshot.num_waiting_reqs), 0),
        token_usage=used / pages if pages else 0.0,
        num_used_tokens=used * capacity // pages if pages else 0,
        max_total_num_tokens=capacity,
    )

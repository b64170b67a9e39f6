"""vLLM's KV-events configuration -> the bridge's sources, and the engine-load record.

vLLM publishes over ZMQ when started with
``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``. Each DP rank binds its own
port (the base port plus the rank); ``AsyncLLM.get_kv_event_sources()`` reports the endpoints it
really bound when the release has it (0.31+, :func:`.releases.kv_event_sources`). Wildcard binds
are dialled on loopback.
"""

from __future__ import annotations

from typing import Any

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_kv_bridge import KvSource
from smg_servicer_kv_bridge.endpoints import dialable, offset
from smg_servicer_vllm import releases


def _enabled(config: Any) -> bool:
    return bool(
        config is not None
        and getattr(config, "enable_kv_cache_events", False)
        and getattr(config, "publisher", None) == "zmq"
    )


def kv_sources(engine: Any) -> list[KvSource] | None:
    """The publishers to relay, or None when vLLM publishes no ZMQ KV events."""
    config = getattr(engine.vllm_config, "kv_events_config", None)
    if not _enabled(config):
        return None
    per_rank = releases.kv_event_sources(engine)
    if not per_rank:  # a release that cannot report them (before 0.31): base port + rank
        ranks = int(getattr(engine.vllm_config.parallel_config, "data_parallel_size", 1) or 1)
        per_rank = dict.fromkeys(range(ranks), None)
    sources: list[KvSource] = []
    for rank, own in sorted(per_rank.items()):
        cfg: Any = own if _enabled(own) else config
        shift = 0 if cfg is own else rank  # reported endpoints are already offset
        replay = getattr(cfg, "replay_endpoint", None)
        sources.append(
            KvSource(
                rank=int(rank),
                endpoint=dialable(offset(str(cfg.endpoint), shift)),
                replay_endpoint=dialable(offset(str(replay), shift)) if replay else None,
                topic=str(getattr(cfg, "topic", "") or "").encode(),
                hwm=int(getattr(cfg, "hwm", 100_000) or 100_000),
            )
        )
    return sources


def engine_load(load: pb.SchedulerLoad) -> common_pb2.EngineLoad:
    """The ``EngineLoad`` record stamped on KV batches, from a GetLoads row."""
    return common_pb2.EngineLoad(
        running_requests=max(load.num_running_reqs, 0),
        waiting_requests=max(load.num_waiting_reqs, 0),
        token_usage=load.token_usage,
        gen_throughput=load.gen_throughput,
        max_running_requests=max(load.max_running_requests, 0),
        cache_hit_rate=load.cache_hit_rate,
        num_used_tokens=load.num_used_tokens,
        max_total_num_tokens=load.max_total_num_tokens,
    )

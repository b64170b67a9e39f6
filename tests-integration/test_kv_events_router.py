"""The real router with ``--policy cache_aware`` subscribes to a worker's KV events (our bridge,
on vLLM and on SGLang), is answered at once although the engine has published nothing yet, and
keeps the stream while it routes requests."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from smg_it.harness import Router, Worker, free_port, sglang_worker, vllm_worker
from smg_it.kv import kv_events_config

pytestmark = pytest.mark.integration


def _worker(engine: str, model: Path) -> Worker:
    config = kv_events_config(engine)
    if engine == "vllm":
        return vllm_worker(model, free_port(), "--kv-events-config", config)
    # SGLang's launcher logs at warning in the test flags; the subscription lines are info.
    return sglang_worker(model, free_port(), "--kv-events-config", config, "--log-level", "info")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_cache_aware_router_keeps_the_kv_event_stream(tiny_model: Path, engine: str) -> None:
    worker = _worker(engine, tiny_model)
    with worker, Router(worker.url, policy="cache_aware") as router:
        model = httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]
        # Before any request, i.e. with an engine that has published nothing: the stream opens.
        deadline = time.monotonic() + 10
        while "KV event stream connected" not in router.log.read_text():
            assert time.monotonic() < deadline, "the subscription was not answered while idle"
            time.sleep(0.1)
        story = "Once upon a time the router sent every request to the best worker. " * 30
        for i in range(6):
            reply = httpx.post(
                router.base + "/v1/completions",
                timeout=60,
                json={"model": model, "prompt": story + str(i), "max_tokens": 4},
            )
            assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 20
        while "KV-event subscription opened" not in worker.log.read_text():
            assert time.monotonic() < deadline, "the router never subscribed"
            time.sleep(0.2)
        time.sleep(1.5)  # heartbeats flow; the subscription must still be open afterwards
        log = worker.log.read_text()
        assert "KV-event stream reset" not in log
        opened, closed = log.count("KV-event subscription opened"), log.count("relay closed")
        assert opened - closed == 1, "exactly one live subscription, kept open by the router"
        routed = router.log.read_text()
        assert "KV event stream connected" in routed
        assert routed.count("KV event stream connected") == 1, "no reconnect: the stream held"
        # smg 1.13 gives a subscription 2 s to answer, then vetoes the worker as unreachable:
        # the servicer answers at once and sends load records before the engine's first batch.
        assert "Failed to subscribe to KV events" not in routed
        assert "vetoed by liveness" not in routed

"""tools/bench/death.py's reading of a run: when clients first failed, the last answer the dead
worker gave (the router's own "no worker" refusals are not the worker's), the health verdict."""

from __future__ import annotations

import death
import pytest

pytestmark = pytest.mark.unit

ROW = {
    "engine": "vllm",
    "lane": "zmq",
    "answers": [
        [0.01, 500, "start_generation_failed: engine ZMQ client is closed"],
        [1.02, 500, "start_generation_failed: engine ZMQ client is closed"],
        [2.03, 404, "model_not_found: No available workers for model"],
        [3.04, 503, "no_available_workers: unhealthy or circuit breaker open"],
    ],
    "unhealthy_s": None,
    "launcher_exit": 1,
    "watch_s": 190.0,
}


def test_the_reading_separates_the_dead_workers_answers_from_the_routers() -> None:
    assert death.summary(ROW) == {
        "first_failure_s": 0.01,
        "last_sent_to_worker_s": 1.02,
        "statuses": "404/500/503",
        "unhealthy_s": None,
    }
    table = death.markdown([ROW, {**ROW, "lane": "python", "unhealthy_s": 121.5, "answers": []}])
    assert "| vllm | zmq | 0.01 s | 1.02 s | 404/500/503 | not in 190.0 s | 1 |" in table
    assert "| vllm | python | - | - |  | 121.5 s | 1 |" in table
    assert table.startswith("Router health flags: defaults.")

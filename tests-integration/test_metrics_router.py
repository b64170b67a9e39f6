"""/metrics of a worker behind the real router: streams in flight as the servicer sees them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smg_it.harness import Router, Worker, free_port, mlx_worker
from smg_servicer_core.testing.metrics import scrape, value

pytestmark = pytest.mark.integration
STREAMS = 8


@pytest.fixture(scope="module")
def metered(tiny_model: Path) -> Iterator[tuple[Worker, Router, int]]:
    metrics_port = free_port()
    worker = mlx_worker(tiny_model, free_port(), "--metrics-port", str(metrics_port))
    with worker, Router(worker.url) as router:
        yield worker, router, metrics_port


def test_a_scrape_during_eight_streams_shows_eight_in_flight(metered) -> None:
    _, router, metrics_port = metered
    model = httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": "Tell me a long story",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = threading.Barrier(STREAMS + 1, timeout=60)
    scraped = threading.Event()
    usage: list[int] = []

    def stream() -> None:
        with httpx.stream("POST", router.base + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    break  # the first token arrived: this stream is in flight
            started.wait()
            scraped.wait(60)  # hold the stream open (unread) until the scrape is taken
            for line in lines:
                if '"usage"' in line and '"completion_tokens"' in line:
                    usage.append(int(line.split('"completion_tokens":')[1].split(",")[0]))

    threads = [threading.Thread(target=stream) for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    started.wait()
    during = scrape(metrics_port)
    scraped.set()
    for thread in threads:
        thread.join(120)
    after = scrape(metrics_port)
    assert value(during, "smg_servicer_generate_streams_in_flight") == STREAMS
    assert value(after, "smg_servicer_generate_streams_in_flight") == 0
    assert usage == [900] * STREAMS
    assert value(after, "smg_servicer_generate_output_tokens_total") >= STREAMS * 900
    assert value(after, "smg_servicer_rpc_requests_total", rpc="Generate", code="OK") >= STREAMS

"""Adaptive coalescing through the real router: a worker that sends every step a stream was behind
on as one chunk and a worker that sends one token per chunk (``SMG_STREAM_COALESCE=0``) give the
router's clients the same text and usage (greedy, the same model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from smg_it.harness import Router, Worker, free_port, mlx_worker
from smg_servicer_core.testing.metrics import scrape, value

pytestmark = pytest.mark.integration

#: Enough streams at once that the worker's streams fall behind its engine (MLX batches them).
STREAMS = 32
MAX_TOKENS = 96


def _worker(model: Path, coalesce: bool) -> tuple[Worker, int]:
    metrics_port = free_port()
    worker = mlx_worker(model, free_port(), "--metrics-port", str(metrics_port))
    worker.env["SMG_STREAM_COALESCE"] = "1" if coalesce else "0"
    return worker, metrics_port


@pytest.fixture(scope="module")
def deployments(tiny_model: Path) -> Iterator[dict[bool, tuple[Router, int]]]:
    (on, on_metrics), (off, off_metrics) = _worker(tiny_model, True), _worker(tiny_model, False)
    with on, off, Router(on.url) as on_router, Router(off.url) as off_router:
        yield {True: (on_router, on_metrics), False: (off_router, off_metrics)}


def _stream(router: Router, model: str, prompt: str) -> tuple[str, dict[str, int]]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, usage = [], {}
    with httpx.stream("POST", router.base + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            text.extend(c.get("text") or "" for c in event.get("choices") or [])
            usage = event.get("usage") or usage
    return "".join(text), usage


def _run(router: Router, prompts: list[str]) -> list[tuple[str, dict[str, int]]]:
    model = httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]
    with ThreadPoolExecutor(STREAMS) as pool:
        return list(pool.map(lambda p: _stream(router, model, p), prompts))


def test_text_and_usage_are_the_same_with_and_without_coalescing(deployments) -> None:
    prompts = [f"Story {i}: once upon a time" for i in range(STREAMS)]
    results = {coalesce: _run(router, prompts) for coalesce, (router, _) in deployments.items()}
    assert results[True] == results[False]
    assert all(usage["completion_tokens"] == MAX_TOKENS for _, usage in results[True])
    assert all(text for text, _ in results[True])

    def chunks(coalesce: bool) -> tuple[float, float]:
        samples = scrape(deployments[coalesce][1])
        return (
            value(samples, "smg_servicer_generate_chunk_tokens_count"),
            value(samples, "smg_servicer_generate_chunk_tokens_sum"),
        )

    count_off, tokens_off = chunks(False)
    assert count_off == tokens_off >= STREAMS * MAX_TOKENS  # one token per chunk
    count_on, tokens_on = chunks(True)
    assert tokens_on >= STREAMS * MAX_TOKENS
    assert count_on < tokens_on, "no stream fell behind: nothing was coalesced"

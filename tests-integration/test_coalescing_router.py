"""Adaptive coalescing through the real router: a worker that sends every step a stream was behind
on as one chunk and a worker that sends one token per chunk (``SMG_STREAM_COALESCE=0``) give the
router's clients the same text and usage.

Streams fall behind when the engine makes tokens faster than gRPC takes messages. The workers are
the fakes at the engine boundary, which cost nothing per token, so every run coalesces: core's
fake engine on the MLX wire (cumulative counts per chunk) and vLLM's fake on the vLLM wire (its
collector merges what a late reader missed, as vLLM's does: ``test_coalescing.py`` holds the fake
to the real engine; counts per chunk are the chunk's own). Both serve the tiny model's tokenizer,
whose vocabulary the fakes' tokens are drawn from."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from smg_it.harness import Router, Worker, free_port
from smg_servicer_core.testing.metrics import scrape, value

pytestmark = pytest.mark.integration

Deployment = tuple[Router, int]  # the router, its worker's /metrics port
STREAMS = 16
MAX_TOKENS = 64


def _fake_worker(wire: str, model: Path, coalesce: bool) -> tuple[Worker, int]:
    port, metrics_port = free_port(), free_port()
    if wire == "mlx":
        cmd = [sys.executable, "-m", "smg_servicer_core.testing", "--host", "127.0.0.1",
               "--port", str(port), "--tokenizer-path", str(model),
               "--metrics-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
        env = {}
    else:
        cmd = [sys.executable, "-m", "smg_servicer_vllm.testing", "--port", str(port),
               "--tokenizer", str(model)]  # fmt: skip
        env = {"SMG_VLLM_SERVICER_METRICS_PORT": str(metrics_port)}
    env["SMG_STREAM_COALESCE"] = "1" if coalesce else "0"
    return Worker(cmd, port, env=env), metrics_port


@pytest.fixture(scope="module", params=["mlx", "vllm"])
def pair(
    request: pytest.FixtureRequest, tiny_model: Path
) -> Iterator[dict[bool, tuple[Router, int]]]:
    (on, on_metrics) = _fake_worker(request.param, tiny_model, True)
    (off, off_metrics) = _fake_worker(request.param, tiny_model, False)
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


def _chunks(metrics_port: int) -> tuple[float, float]:
    """(chunks, tokens) the worker streamed."""
    samples = scrape(metrics_port)
    return (
        value(samples, "smg_servicer_generate_chunk_tokens_count"),
        value(samples, "smg_servicer_generate_chunk_tokens_sum"),
    )


def test_text_and_usage_are_the_same_with_and_without_coalescing(pair) -> None:
    prompts = [f"Story {i}: once upon a time" for i in range(STREAMS)]
    results = {coalesce: _run(router, prompts) for coalesce, (router, _) in pair.items()}
    assert results[True] == results[False]
    assert all(usage["completion_tokens"] == MAX_TOKENS for _, usage in results[True])
    assert all(text for text, _ in results[True])
    chunks_off, tokens_off = _chunks(pair[False][1])
    assert chunks_off == tokens_off >= STREAMS * MAX_TOKENS, "one token per chunk"
    chunks_on, tokens_on = _chunks(pair[True][1])
    assert tokens_on >= STREAMS * MAX_TOKENS
    assert chunks_on < tokens_on / 2, "the streams that fell behind were coalesced"

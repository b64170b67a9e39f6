"""The seed's literal command, ``python -m smg_grpc_servicer.mlx --model meta-llama/Llama-2-7b-hf``:
a Hugging Face id resolved offline through a cache entry built from the tiny model, served
through the real router, which fetches the tokenizer bundle of the same snapshot."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from smg_it.harness import Router, free_port, mlx_worker
from smg_servicer_core.testing.hf_cache import add_to_hf_cache
from smg_servicer_mlx.testing import serve_command

pytestmark = pytest.mark.integration
SEED_ID = "meta-llama/Llama-2-7b-hf"


def test_a_hub_id_serves_offline_through_the_router(tiny_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    add_to_hf_cache(tiny_model, cache, SEED_ID)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    port = free_port()
    with mlx_worker(SEED_ID, port, env=env) as worker, Router(worker.url) as router:
        served = httpx.get(router.base + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in served] == [SEED_ID]
        body = {
            "model": SEED_ID,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        reply = httpx.post(router.base + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 8
    assert worker.proc is not None
    assert worker.proc.returncode == 0


def test_an_uncached_id_offline_fails_at_start_with_what_to_do(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        serve_command("smg-test/not-cached", free_port()),
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "not in the Hugging Face cache" in done.stderr
    assert "HF_HUB_OFFLINE" in done.stderr
    assert "Traceback" not in done.stderr

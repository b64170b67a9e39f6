"""Images through the real router: a vLLM worker started by vLLM's own gRPC launcher with the
plugin's ``--mm-processor inprocess`` (tiny float32 Idefics3, which no router spec claims), in
front of it ``smg launch --mm-processing worker`` and ``auto``. The router renders the chat
template, tokenizes, and forwards ``media_refs``; the worker fetches and expands the image.

A second launcher worker runs ``--mm-processor redis`` next to a real ``redis-server`` and the
real sidecar (``python -m smg_grpc_servicer.vllm.mm_sidecar``): the same chats through the router
give the same text and usage as the in-process worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smg_it.harness import Router, Worker, free_port, vllm_worker
from smg_servicer_core.testing.media import data_url, png_image
from smg_servicer_core.testing.redis_server import RedisServer
from smg_servicer_vllm.testing.sidecar import SidecarProcess, sidecar_args

pytestmark = pytest.mark.integration

PROMPT_TEXT = "describe this picture"


@pytest.fixture(scope="module")
def media_dir(vlm_media_dir: Path) -> Path:
    return vlm_media_dir


@pytest.fixture(scope="module")
def sidecar_router(
    tiny_vlm: Path, media_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Router, Worker, SidecarProcess]]:
    """Redis, the sidecar, a ``--mm-processor redis`` worker and a strict router, in that order
    (the router reads the worker's labels when it registers it)."""
    with RedisServer(password="router-secret") as redis:
        args = sidecar_args('{"image": 2}', "--allowed-local-media-path", str(media_dir))
        log = tmp_path_factory.mktemp("sidecar") / "sidecar.log"
        sidecar = SidecarProcess(tiny_vlm, redis.url, *args, log_path=log).start()
        try:
            extra = ("--mm-processor", "redis", "--mm-redis-url", redis.url)
            extra += ("--limit-mm-per-prompt", '{"image": 2}')
            with (
                vllm_worker(tiny_vlm, free_port(), *extra) as worker,
                Router(worker.url, "--mm-processing", "worker") as router,
            ):
                yield router, worker, sidecar
        finally:
            sidecar.kill()


@pytest.fixture(scope="module", params=["worker", "auto"])
def vlm_router(request: pytest.FixtureRequest, vlm_worker: Worker) -> Iterator[Router]:
    with Router(vlm_worker.url, "--mm-processing", request.param) as router:
        yield router


def _expanded_prompt_len(model: Path) -> int:
    """The chat prompt's length once the worker expands the image's one anchor (7 positions)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT_TEXT}]}
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(str(text))
    return len(ids) + 6


def _chat(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": PROMPT_TEXT},
                ],
            }
        ],
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


def _model_id(router: Router) -> str:
    return httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]


def _post(router: Router, body: dict[str, Any]) -> httpx.Response:
    body["model"] = _model_id(router)
    return httpx.post(router.base + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("source", ["data", "file"])
def test_a_chat_with_an_image_returns_200(
    vlm_router: Router, tiny_vlm: Path, media_dir: Path, source: str
) -> None:
    url = (
        data_url(png_image(40, 50, seed=1)) if source == "data" else (media_dir / "a.png").as_uri()
    )
    response = _post(vlm_router, _chat(url))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 6
    assert body["usage"]["prompt_tokens"] == _expanded_prompt_len(tiny_vlm)
    assert body["choices"][0]["message"]["content"]


def test_a_streamed_chat_with_an_image(vlm_router: Router, tiny_vlm: Path, media_dir: Path) -> None:
    body = _chat(
        (media_dir / "a.png").as_uri(), stream=True, stream_options={"include_usage": True}
    )
    body["model"] = _model_id(vlm_router)
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", vlm_router.base + "/v1/chat/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    text = "".join(
        choice.get("delta", {}).get("content") or ""
        for e in events
        for choice in e.get("choices", [])
    )
    usage = next(e["usage"] for e in reversed(events) if e.get("usage"))
    assert text and usage["completion_tokens"] == 6
    assert usage["prompt_tokens"] == _expanded_prompt_len(tiny_vlm)
    # Streamed and not streamed agree.
    whole = _post(vlm_router, _chat((media_dir / "a.png").as_uri())).json()
    assert whole["choices"][0]["message"]["content"] == text


def test_a_refused_image_is_a_400(vlm_router: Router) -> None:
    response = _post(vlm_router, _chat("file:///etc/hostname"))
    assert response.status_code == 400, response.text


def _labels(entry: Any) -> dict[str, str]:
    """Every string-valued key of a /workers entry, nested dicts flattened."""
    found: dict[str, str] = {}
    if isinstance(entry, dict):
        for key, value in entry.items():
            if isinstance(value, dict | list):
                found |= _labels(value)
            else:
                found[str(key)] = str(value)
    elif isinstance(entry, list):
        for value in entry:
            found |= _labels(value)
    return found


def test_the_router_shows_the_advertised_labels(vlm_router: Router, vlm_worker: Worker) -> None:
    workers = httpx.get(vlm_router.base + "/workers", timeout=10).json()
    entries = workers.get("workers", workers) if isinstance(workers, dict) else workers
    (entry,) = [w for w in entries if str(vlm_worker.port) in w.get("url", "")]
    labels = _labels(entry)
    assert labels.get("mm_processor") == "inprocess", entry
    assert labels.get("mm_media_ref_schemes") == "http,https,data,file"
    assert labels.get("mm_processor_source") == "flag"
    assert labels.get("mm_item_limits") == "image=2"


def test_the_worker_logged_its_mode_and_source(vlm_worker: Worker) -> None:
    log = vlm_worker.log.read_text(errors="replace")
    assert "VllmEngineServicer initialized (mm_processor=inprocess, source=flag)" in log
    assert "without --allowed-media-domains" in log


@pytest.mark.parametrize("source", ["data", "file"])
def test_a_chat_through_the_sidecar_matches_the_inprocess_worker(
    sidecar_router: tuple[Router, Worker, SidecarProcess],
    vlm_router: Router,
    media_dir: Path,
    source: str,
) -> None:
    router, _, _ = sidecar_router
    url = (
        data_url(png_image(40, 50, seed=1)) if source == "data" else (media_dir / "a.png").as_uri()
    )
    via_sidecar = _post(router, _chat(url))
    via_worker = _post(vlm_router, _chat(url))
    assert via_sidecar.status_code == via_worker.status_code == 200, via_sidecar.text
    a, b = via_sidecar.json(), via_worker.json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"] == b["usage"]


def test_the_sidecar_worker_streams_and_advertises_redis(
    sidecar_router: tuple[Router, Worker, SidecarProcess], media_dir: Path
) -> None:
    router, worker, sidecar = sidecar_router
    body = _chat((media_dir / "a.png").as_uri(), stream=True)
    body["model"] = _model_id(router)
    chunks = 0
    with httpx.stream(
        "POST", router.base + "/v1/chat/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        chunks = sum(1 for line in response.iter_lines() if line.startswith("data: {"))
    assert chunks >= 2
    workers = httpx.get(router.base + "/workers", timeout=10).json()
    entries = workers.get("workers", workers) if isinstance(workers, dict) else workers
    (entry,) = [w for w in entries if str(worker.port) in w.get("url", "")]
    assert _labels(entry).get("mm_processor") == "redis", entry
    for log in (worker.log.read_text(errors="replace"), sidecar.log()):
        assert "router-secret" not in log
    assert "VllmEngineServicer initialized (mm_processor=redis, source=flag)" in (
        worker.log.read_text(errors="replace")
    )


def test_a_refused_image_through_the_sidecar_is_a_400(
    sidecar_router: tuple[Router, Worker, SidecarProcess],
) -> None:
    router, _, _ = sidecar_router
    response = _post(router, _chat(data_url(b"not an image")))
    assert response.status_code == 400, response.text

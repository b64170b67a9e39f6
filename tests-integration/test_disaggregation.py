"""SGLang prefill and decode workers behind the router's PD mode (``--pd-disaggregation
--prefill grpc://… <bootstrap port> --decode grpc://…``), Mooncake moving the KV over TCP.

SGLang's CPU build asks for pinned memory and a CUDA event on its KV transfer path; these workers
run with the test environment's shim that makes both no-ops on a machine without an accelerator
(``tools/envs/sglang-cpu/shims/pin_memory_shim.py``). Without it the prefill scheduler dies on the
first KV chunk: packages/smg-servicer-sglang/tests/test_disaggregation.py pins that, with SGLang's
message.

What is shown here: the router registers both workers; chat and completions, streamed and not,
give the same text and usage as one worker alone; and the decode worker continues the prefilled
prompt from the KV it received (with the copy skipped on the prefill side, every token after the
first changes; with it, they are the single worker's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import smg_it
from smg_it.harness import free_port, sglang_worker
from smg_servicer_core.config import environment
from smg_servicer_core.testing.router import Router
from smg_servicer_sglang.testing import PD_CPU_FLAGS, PIN_MEMORY_SHIM_ENV

pytestmark = pytest.mark.integration

#: The fault injection that skips the prefill side's KV copy while a file exists.
KV_SKIP = Path(smg_it.__file__).parent / "kv_skip"
PROMPT = "The router sends each request to a worker and the worker streams tokens back."
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def skip_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pd") / "skip-kv"


@pytest.fixture(scope="module")
def pd(tiny_model: Path, skip_file: Path) -> Iterator[dict[str, Any]]:
    """A prefill and a decode worker behind the router's PD mode, and one worker alone behind
    a router of its own."""
    bootstrap = free_port()
    path = environment().get("PYTHONPATH", "")
    prefill_env = PIN_MEMORY_SHIM_ENV | {
        "PYTHONPATH": f"{KV_SKIP}:{path}" if path else str(KV_SKIP),
        "SMG_PD_SKIP_KV_FILE": str(skip_file),
    }
    workers = {
        "prefill": sglang_worker(
            tiny_model, free_port(), *PD_CPU_FLAGS["prefill"],
            "--disaggregation-bootstrap-port", str(bootstrap), env=prefill_env,
        ),
        "decode": sglang_worker(
            tiny_model, free_port(), *PD_CPU_FLAGS["decode"], env=PIN_MEMORY_SHIM_ENV
        ),
        "alone": sglang_worker(tiny_model, free_port()),
    }  # fmt: skip
    try:
        for worker in workers.values():
            worker.start()
        for worker in workers.values():
            assert worker.process is not None
            worker.process.wait_serving(worker.start_timeout_s)
        prefill, decode = workers["prefill"], workers["decode"]
        with (
            Router(
                prefill.url, "--pd-disaggregation",
                "--prefill", prefill.url, str(bootstrap), "--decode", decode.url,
            ) as pd_router,
            Router(workers["alone"].url) as alone_router,
        ):  # fmt: skip
            yield {"workers": workers, "pd": pd_router, "alone": alone_router}
    finally:
        for worker in workers.values():
            worker.stop()


def _body(kind: str, model: Path, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": str(model), "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
    }  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kind == "chat":
        return body | {"messages": [{"role": "user", "content": PROMPT}]}
    return body | {"prompt": PROMPT}


def ask(router: Router, kind: str, model: Path, stream: bool) -> tuple[str, dict[str, Any]]:
    """The text and usage of one greedy request."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body = _body(kind, model, stream)
    if not stream:
        reply = httpx.post(router.base + path, json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        data = reply.json()
        choice = data["choices"][0]
        return choice["message"]["content"] if kind == "chat" else choice["text"], data["usage"]
    text, usage = "", {}
    with httpx.stream("POST", router.base + path, json=body, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            for choice in event.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            usage = event.get("usage") or usage
    return text, usage


def test_the_router_registers_the_prefill_and_the_decode_worker(pd: dict[str, Any]) -> None:
    prefill, decode = pd["workers"]["prefill"], pd["workers"]["decode"]
    workers = httpx.get(pd["pd"].base + "/workers", timeout=10).json()["workers"]
    assert {w["url"]: w["worker_type"] for w in workers} == {
        prefill.url: "prefill",
        decode.url: "decode",
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_a_pd_request_equals_one_worker_alone_usage_included(
    pd: dict[str, Any], tiny_model: Path, kind: str, stream: bool
) -> None:
    text, usage = ask(pd["pd"], kind, tiny_model, stream)
    alone_text, alone_usage = ask(pd["alone"], kind, tiny_model, stream)
    assert text and text == alone_text
    assert usage["completion_tokens"] == MAX_TOKENS
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        alone_usage["prompt_tokens"],
        alone_usage["completion_tokens"],
    )


def test_the_decode_worker_continues_from_the_kv_the_prefill_worker_sent(
    pd: dict[str, Any], tiny_model: Path, skip_file: Path
) -> None:
    """With the prefill side's KV copy skipped, the first token (sent beside the KV) is still
    right and the rest change: the decode worker used the transferred KV, it did not recompute
    the prompt. With the copy back, the answer is one worker's again."""
    prefill = pd["workers"]["prefill"]
    expected, _ = ask(pd["alone"], "completions", tiny_model, False)
    skip_file.touch()
    try:
        skipped, usage = ask(pd["pd"], "completions", tiny_model, False)
    finally:
        skip_file.unlink()
    assert "smg-kv-skip: KV copy skipped" in prefill.log.read_text()
    assert usage["completion_tokens"] == MAX_TOKENS
    assert skipped != expected
    again, _ = ask(pd["pd"], "completions", tiny_model, False)
    assert again == expected
    for worker in pd["workers"].values():
        assert worker.proc is not None and worker.proc.poll() is None

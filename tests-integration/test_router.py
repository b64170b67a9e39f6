"""The real smg router in front of each engine's servicer, launched the way users launch it:
MLX through ``python -m smg_grpc_servicer.mlx``, vLLM through its own gRPC launcher (which
imports ``smg_grpc_servicer.vllm``), SGLang through ``sglang serve --smg-grpc-mode`` (which calls
``smg_grpc_servicer.sglang.server.serve_grpc``), TokenSpeed through
``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns; TokenSpeed's real front end
with its GPU scheduler stood in)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import pytest

from smg_it import conformance, dashboard
from smg_it.engine_metrics import (
    SGLANG_COUNTERS,
    TOKENSPEED_COUNTERS,
    VLLM_COUNTERS,
    completions,
    counted,
    tokenspeed_families,
)
from smg_it.harness import Worker, free_port
from smg_servicer_core.testing.metrics import family_names, scrape, total
from smg_servicer_core.testing.otlp import OtlpReceiver, ReceivedSpan
from smg_servicer_core.testing.requests import STUBS, WIRES, generate_request

pytestmark = pytest.mark.integration

ENGINES = sorted(STUBS)


@pytest.fixture(params=ENGINES)
def deployment(request: pytest.FixtureRequest) -> tuple[str, object, object]:
    worker, router = request.getfixturevalue(f"{request.param}_router")
    return request.param, worker, router


def _model(router) -> str:
    models = httpx.get(router.base + "/v1/models", timeout=10).json()
    return models["data"][0]["id"]


def test_the_router_detects_the_runtime(deployment) -> None:
    engine, worker, router = deployment
    workers = httpx.get(router.base + "/workers", timeout=10).json()
    entries = workers.get("workers", workers) if isinstance(workers, dict) else workers
    (entry,) = [w for w in entries if str(worker.port) in w.get("url", "")]
    assert entry["runtime_type"] == engine, entry


def _sse(response: httpx.Response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: ") :]))
    return events


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(deployment, path: str) -> None:
    _, _, router = deployment
    body: dict = {"model": _model(router), "max_tokens": 12, "temperature": 0}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "Hi!"}]
    else:
        body["prompt"] = "Hello there"
    plain = httpx.post(router.base + path, json=body, timeout=60)
    assert plain.status_code == 200, plain.text
    result = plain.json()
    usage = result["usage"]
    choice = result["choices"][0]
    assert 0 < usage["completion_tokens"] <= 12
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert choice["finish_reason"] in {"stop", "length"}
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 12

    with httpx.stream(
        "POST",
        router.base + path,
        timeout=60,
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as streamed:
        assert streamed.status_code == 200
        events = _sse(streamed)
    if path == "/v1/chat/completions":
        text = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
        )
        want = choice["message"]["content"]
    else:
        text = "".join(e["choices"][0].get("text") or "" for e in events if e.get("choices"))
        want = choice["text"]
    assert text == want, "greedy: streaming and non-streaming give the same text"
    finishes = [e["choices"][0].get("finish_reason") for e in events if e.get("choices")]
    assert choice["finish_reason"] in finishes
    usage_events = [e["usage"] for e in events if e.get("usage")]
    assert usage_events and usage_events[-1]["completion_tokens"] == usage["completion_tokens"]


async def _active_requests(engine: str, worker) -> int:
    pb = WIRES[engine][0]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        info = await STUBS[engine](channel).GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        return info.active_requests


def _engine_holds(worker) -> float:
    """The requests the engine itself holds, running or queued, over its ranks: its load gauges
    on ``/metrics`` (SGLang's and TokenSpeed's scheduler snapshots, MLX's batch generator,
    vLLM's scheduler stats as ``GetLoads`` reads them), not the servicer's own registry."""
    samples = scrape(worker.metrics_port)
    return total(samples, "smg_servicer_engine_running_requests") + total(
        samples, "smg_servicer_engine_waiting_requests"
    )


@pytest.mark.parametrize("engine", conformance.ENGINES)
def test_bad_input_gets_the_conformance_tables_answer(
    request: pytest.FixtureRequest, engine: str
) -> None:
    """The Python lane of each engine held to the table every lane is held to
    (smg_it.conformance): our servicer refuses each case with INVALID_ARGUMENT, which the router
    answers 400 with our message; the worker serves on."""
    _, router = request.getfixturevalue(f"{engine}_router")
    model = _model(router)

    def post(path: str, **body: object) -> httpx.Response:
        return httpx.post(
            router.base + path, json={"model": model, "temperature": 0, **body}, timeout=60
        )

    def served() -> bool:
        return post("/v1/completions", prompt="Hello", max_tokens=4).status_code == 200

    assert conformance.mismatches("python", engine, post, served) == []


def test_client_disconnect_stops_generation_on_the_worker(deployment) -> None:
    engine, worker, router = deployment
    body = {
        "model": _model(router),
        "prompt": "Tell me a long story",
        "max_tokens": 900,  # fits every engine's test context (vLLM runs with 1,024)
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
    }
    generated = "vllm:generation_tokens_total"  # vLLM's engine counts every token it makes
    before = total(scrape(worker.metrics_port), generated)
    seen = 0
    with httpx.stream("POST", router.base + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 5:
                # Still inside the stream: the worker and its engine are generating for us.
                assert asyncio.run(_active_requests(engine, worker)) == 1
                deadline = time.monotonic() + 10
                while _engine_holds(worker) < 1:  # the engine's next load report
                    assert time.monotonic() < deadline, "the engine never showed the request"
                    time.sleep(0.05)
                break  # leaving the iterator closes the response: the client is gone
    # The client is gone: the router sends Abort, the worker drops the request, and the engine
    # lets it go (its own counts, not the servicer's).
    deadline = time.monotonic() + 10
    while asyncio.run(_active_requests(engine, worker)) != 0 or _engine_holds(worker) != 0:
        assert time.monotonic() < deadline, "the worker or its engine kept the request"
        time.sleep(0.1)
    if engine == "vllm":  # and it stopped making tokens: the count stands, far short of 900
        made = total(scrape(worker.metrics_port), generated) - before
        time.sleep(1.0)
        assert 0 < total(scrape(worker.metrics_port), generated) - before == made < 450


def test_one_trace_from_the_client_through_the_router_to_the_worker(
    deployment, otlp_receiver: OtlpReceiver
) -> None:
    """A completion sent with W3C trace context makes one trace: the router's ``http_request``
    (a child of the client's span), its ``grpc_execute``, and the worker's ``llm_request`` (a
    child of ``grpc_execute``: the router's context went through gRPC metadata, and the worker
    continued it), whose token counts are the response's. A ``Generate`` sent straight to the
    worker with no trace context makes no worker span, except on vLLM, whose own tracing makes a
    root span for every request."""
    engine, worker, router = deployment
    trace_id, client_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    untraced = f"untraced-{trace_id}"
    with grpc.insecure_channel(worker.url.removeprefix("grpc://")) as channel:
        request = generate_request(engine, [5, 6, 7], max_tokens=2, request_id=untraced)
        assert list(STUBS[engine](channel).Generate(request, timeout=120))
    response = httpx.post(
        router.base + "/v1/completions",
        json={"model": _model(router), "prompt": "hello there", "max_tokens": 4},
        headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]

    def named(name: str) -> Callable[[ReceivedSpan], bool]:
        return lambda s: s.trace_id == trace_id and s.name == name

    http = otlp_receiver.wait_for(named("http_request"))
    execute = otlp_receiver.wait_for(named("grpc_execute"))
    span = otlp_receiver.wait_for(named("llm_request"))
    assert (http.service, http.parent_span_id) == ("smg", client_span)
    assert execute.parent_span_id == http.span_id
    assert (span.parent_span_id, span.kind) == (execute.span_id, 2)  # SERVER
    assert span.service != "smg"
    assert span.attributes["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert span.attributes["gen_ai.usage.completion_tokens"] == usage["completion_tokens"]
    assert str(span.attributes["gen_ai.request.id"]).startswith(execute.attributes["request_id"])
    assert (
        span.attributes["gen_ai.latency.e2e"]
        >= span.attributes["gen_ai.latency.time_to_first_token"]
        > 0
    )
    if engine == "sglang":
        # SGLang's own request trace (its --enable-trace) continues the router's as well: its
        # root span is a child of grpc_execute, the scheduler rank's span hangs under it, and
        # the rank's stages (queue, prefill, decode) under that.
        def of_trace(s: ReceivedSpan) -> bool:
            return s.trace_id == trace_id and s.service == "sglang"

        root = otlp_receiver.wait_for(lambda s: of_trace(s) and s.name.strip().startswith("Req "))
        assert root.parent_span_id == execute.span_id
        rank = otlp_receiver.wait_for(lambda s: of_trace(s) and s.name.startswith("Scheduler"))
        assert rank.parent_span_id == root.span_id
        otlp_receiver.wait_for(lambda s: of_trace(s) and s.parent_span_id == rank.span_id)
    # The untraced call ended before the traced one: a span of it went out no later.
    of_untraced = [
        s for s in otlp_receiver.spans() if s.attributes.get("gen_ai.request.id") == untraced
    ]
    if engine == "vllm":
        assert [(s.name, s.parent_span_id) for s in of_untraced] == [("llm_request", "")]
    else:
        assert of_untraced == []


def test_every_metric_the_dashboard_queries_is_exported_by_a_live_worker(deployment) -> None:
    """``dashboards/smg-servicer.json`` queries only what a worker of each engine it names
    exports, after a request through the router (the engine's load gauges need the engine to
    have reported)."""
    engine, worker, router = deployment
    wanted = dashboard.queried_metrics()[engine]
    assert "smg_servicer_rpc_requests_total" in wanted and len(wanted) >= 15, wanted
    body = {"model": _model(router), "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    assert httpx.post(router.base + "/v1/completions", json=body, timeout=60).status_code == 200
    deadline = time.monotonic() + 30
    while True:  # the engine's loads arrive with its next report, not with the reply
        families = family_names(worker.metrics_port)
        missing = sorted(m for m in wanted if not dashboard.exported(m, families))
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, f"{engine}'s worker exports none of {missing}"


def test_sglang_constraint_that_cannot_continue_is_400_through_the_router(sglang_router) -> None:
    """SGLang's engine-attributed constraint failure (FAILED_PRECONDITION with the
    ``smg-constraint-failed`` trailer) reaches the client as the router's 400 with our words, and
    the worker serves on. On /v1/completions: smg 1.13.0 does not forward a chat request's
    ``min_tokens`` to the worker, so a chat request cannot ask for this dead end."""
    _, router = sglang_router
    body = {
        "model": _model(router),
        "prompt": "Hi",
        "temperature": 0,
        "max_tokens": 16,
        # After "a" the pattern allows only the end, which min_tokens forbids: a dead end.
        "regex": "a",
        "min_tokens": 8,
    }
    failed = httpx.post(router.base + "/v1/completions", json=body, timeout=60)
    assert failed.status_code == 400, failed.text
    assert "the engine could not continue the request under its constraint" in failed.text
    body.pop("min_tokens")
    served = httpx.post(router.base + "/v1/completions", json=body, timeout=60)
    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["text"] == "a"


def test_the_router_selects_no_sglang_adapter_and_the_request_gets_the_base_model(
    sglang_router,
) -> None:
    """smg 1.13.0 never sets ``GenerateRequest.lora_id`` (its SGLang request builders leave it
    empty; ``lora_path`` is parsed and dropped, ``model: "base:adapter"`` is not split) and calls
    none of the LoRA RPCs. This worker has no LoRA and refuses any ``lora_id`` with
    INVALID_ARGUMENT (the router's 400), so a 200 equal to the same request without the adapter
    shows the router dropped it. Fails once the router forwards adapters: test that path then.
    Adapters are selected by calling the worker's gRPC port directly (README, SGLang)."""
    _, router = sglang_router
    plain = {"model": _model(router), "prompt": "Hi", "temperature": 0, "max_tokens": 6}
    served = httpx.post(router.base + "/v1/completions", json=plain, timeout=60)
    assert served.status_code == 200, served.text
    for extra in ({"lora_path": "my-adapter"}, {"lora_id": "my-adapter"}):
        named = httpx.post(router.base + "/v1/completions", json=plain | extra, timeout=60)
        assert named.status_code == 200, named.text
        assert named.json()["choices"][0]["text"] == served.json()["choices"][0]["text"]
    chat = {
        "model": _model(router), "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0, "max_tokens": 6, "lora_path": "my-adapter",
    }  # fmt: skip
    answered = httpx.post(router.base + "/v1/chat/completions", json=chat, timeout=60)
    assert answered.status_code == 200, answered.text


#: vLLM's counters a completed request moves, by how much: (sample, what of the workload).
@contextmanager
def _vllm_http_server(model: Path) -> Iterator[int]:
    """vLLM's own OpenAI HTTP server on the same model and flags, stats on: its port."""
    from smg_servicer_vllm.testing import cpu_flags  # the vLLM environments' (this runs in two)

    port = free_port()
    flags = cpu_flags(model, log_stats=True)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *flags,
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with Worker(cmd, port, start_timeout_s=240):
        yield port


def test_vllms_own_metrics_count_a_workload_through_the_router(vllm_router) -> None:
    """``--metrics-port`` serves vLLM's own metrics (``vllm:*``, vLLM's names and labels) beside
    the servicer's: a workload through the router moves vLLM's request, prompt-token,
    generation-token and TTFT counters by exactly that workload."""
    worker, router = vllm_router
    before = scrape(worker.metrics_port)
    workload = completions(router.base, _model(router))
    ours = counted(worker.metrics_port, workload, before)
    assert ours == {name: workload[what] for name, what in VLLM_COUNTERS}
    assert "smg_servicer_rpc_requests" in family_names(worker.metrics_port)


def test_vllms_metric_families_are_the_ones_its_http_server_exports(
    vllm_router, tiny_model
) -> None:
    """The ``vllm:*`` families of a worker's ``/metrics`` are the ones vLLM's own HTTP server
    exports for the same model and flags (started here; the same workload counted there too).
    The workspace's vLLM only: the 0.27 job leaves this second engine out (tools/envs/list)."""
    worker, router = vllm_router
    completions(router.base, _model(router))
    served = {name for name in family_names(worker.metrics_port) if name.startswith("vllm:")}
    with _vllm_http_server(tiny_model) as port:
        before = scrape(port)
        workload = completions(f"http://127.0.0.1:{port}", str(tiny_model))
        theirs = counted(port, workload, before)
        assert theirs == {name: workload[what] for name, what in VLLM_COUNTERS}
        vllms = {name for name in family_names(port) if name.startswith("vllm:")}
    assert vllms, "vLLM's HTTP server exports vllm:* families"
    assert served == vllms


def test_sglangs_own_metrics_count_a_workload_through_the_router(sglang_router) -> None:
    """With SGLang's ``--enable-metrics``, ``--metrics-port`` serves SGLang's own families beside
    the servicer's: the tokenizer manager's (whose role the servicer holds) move by exactly a
    workload through the router, and the scheduler ranks' (written to SGLang's multi-process
    folder) are there too."""
    worker, router = sglang_router
    before = scrape(worker.metrics_port)
    workload = completions(router.base, _model(router))
    ours = counted(worker.metrics_port, workload, before, SGLANG_COUNTERS)
    assert ours == {name: workload[what] for name, what in SGLANG_COUNTERS}
    families = family_names(worker.metrics_port)
    assert {"sglang:num_running_reqs", "smg_servicer_rpc_requests"} <= families


def test_tokenspeeds_own_metrics_count_a_workload_through_the_router(tokenspeed_router) -> None:
    """With TokenSpeed's ``--enable-metrics``, ``--metrics-port`` serves TokenSpeed's own
    ``tokenspeed:*`` families beside the servicer's: its front end's counters move by exactly a
    workload through the router, and every family served is one TokenSpeed defines (its
    scheduler's stand-in here writes none of the ranks' families)."""
    worker, router = tokenspeed_router
    before = scrape(worker.metrics_port)
    workload = completions(router.base, _model(router))
    ours = counted(worker.metrics_port, workload, before, TOKENSPEED_COUNTERS)
    assert ours == {name: workload[what] for name, what in TOKENSPEED_COUNTERS}
    served = {n for n in family_names(worker.metrics_port) if n.startswith("tokenspeed:")}
    defined = tokenspeed_families()
    assert served, "the worker serves tokenspeed:* families"
    assert served <= defined, sorted(served - defined)

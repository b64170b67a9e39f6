"""SGLang's own metric families on a gRPC worker are the ones SGLang's own HTTP server exports.

A worker of ours (``sglang serve --smg-grpc-mode --enable-metrics``, ``--metrics-port``) and
SGLang's own OpenAI HTTP server on the same model and flags, each given the same workload (the
worker straight over gRPC: no router is needed to count). Runs in the second workspace session
(``workspace-b`` in tools/envs/list), beside the first: two engine starts. SGLang 0.5.23 only;
the counts through the router are ``test_router.py``'s, on 0.5.20 too."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from smg_it.engine_metrics import (
    SGLANG_COUNTERS,
    completions,
    counted,
    sglang_http_layer_families,
    sglang_http_server,
)
from smg_it.harness import free_port, metered_worker
from smg_servicer_core.testing.metrics import family_names, scrape
from smg_servicer_core.testing.requests import STUBS, generate_request

pytestmark = pytest.mark.integration


def _generate(url: str) -> dict[str, int]:
    """The same three greedy requests as ``completions``, straight to a worker: what they
    counted."""
    done = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    with grpc.insecure_channel(url.removeprefix("grpc://")) as channel:
        stub = STUBS["sglang"](channel)
        for i, max_tokens in enumerate((5, 6, 7)):
            ids = [11, 12, 13, 14, 20 + i]  # a shared prefix: later ones hit the cache
            request = generate_request("sglang", ids, max_tokens=max_tokens)
            request.sampling_params.ignore_eos = True
            [reply] = list(stub.Generate(request, timeout=120))
            assert reply.complete.completion_tokens == max_tokens
            done["requests"] += 1
            done["prompt_tokens"] += reply.complete.prompt_tokens
            done["completion_tokens"] += max_tokens
    return done


def test_sglangs_metric_families_are_the_ones_its_http_server_exports(tiny_model: Path) -> None:
    """The ``sglang:*`` families of a worker's ``/metrics`` (SGLang's ``--enable-metrics``) are
    the ones SGLang's own HTTP server exports for the same model and flags, less its HTTP
    layer's (``http_requests``, ``http_responses``...: read from SGLang's source; a gRPC
    worker's calls are counted by ``smg_servicer_rpc_*``). The same workload moves the same
    counters by exactly itself on both."""
    metrics_port = free_port()
    worker = metered_worker("sglang", tiny_model, free_port(), metrics_port, engine_stats=True)
    with worker:
        before = scrape(metrics_port)
        ours = counted(metrics_port, _generate(worker.url), before, SGLANG_COUNTERS)
        served = {n for n in family_names(metrics_port) if n.startswith("sglang:")}
    with sglang_http_server(tiny_model) as port:
        before = scrape(port)
        workload = completions(f"http://127.0.0.1:{port}", str(tiny_model))
        theirs = counted(port, workload, before, SGLANG_COUNTERS)
        sglangs = {name for name in family_names(port) if name.startswith("sglang:")}
    assert theirs == {name: workload[what] for name, what in SGLANG_COUNTERS}
    assert set(ours.values()) != {0}
    assert sglangs, "SGLang's HTTP server exports sglang:* families"
    http_layer = sglang_http_layer_families()
    assert http_layer <= sglangs  # what its HTTP layer adds
    assert served == sglangs - http_layer, (sorted(served - sglangs), sorted(sglangs - served))

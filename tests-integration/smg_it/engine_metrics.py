"""The engines' own metrics in tests: a known workload, the counters it must move, and the
references a worker's families are compared with (each engine's own HTTP server, or its own
definitions where it has none), read from the engine's environment.

    workload = completions(base, model)           # through a router or an engine's HTTP server
    moved = counted(port, workload, before, SGLANG_COUNTERS)
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from smg_it.harness import Worker, free_port
from smg_it.paths import sglang_python, tokenspeed_python
from smg_servicer_core.testing.metrics import Samples, scrape, total

#: (a counter's sample, what of the workload it counts)
Counters = tuple[tuple[str, str], ...]

VLLM_COUNTERS: Counters = (
    ("vllm:request_success_total", "requests"),
    ("vllm:prompt_tokens_total", "prompt_tokens"),
    ("vllm:generation_tokens_total", "completion_tokens"),
    ("vllm:time_to_first_token_seconds_count", "requests"),
)
SGLANG_COUNTERS: Counters = (
    ("sglang:num_requests_total", "requests"),
    ("sglang:prompt_tokens_total", "prompt_tokens"),
    ("sglang:generation_tokens_total", "completion_tokens"),
    ("sglang:time_to_first_token_seconds_count", "requests"),
)
TOKENSPEED_COUNTERS: Counters = (
    ("tokenspeed:num_requests_total", "requests"),
    ("tokenspeed:prompt_tokens_total", "prompt_tokens"),
    ("tokenspeed:generation_tokens_total", "completion_tokens"),
    ("tokenspeed:time_to_first_token_seconds_count", "requests"),
)


def completions(base: str, model: str) -> dict[str, int]:
    """Three greedy completions of 5, 6 and 7 tokens: what they asked for, counted from usage."""
    done = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for i, max_tokens in enumerate((5, 6, 7)):
        body = {"model": model, "prompt": f"Count {i}: one two", "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        reply = httpx.post(base + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        assert usage["completion_tokens"] == max_tokens
        done["requests"] += 1
        done["prompt_tokens"] += usage["prompt_tokens"]
        done["completion_tokens"] += max_tokens
    return done


def counted(
    port: int, workload: dict[str, int], before: Samples, counters: Counters = VLLM_COUNTERS
) -> dict[str, float]:
    """Each of ``counters``' change since ``before``, once they reach the workload (vLLM records
    a step's stats just after handing out its outputs) or 10 s passed."""
    deadline = time.monotonic() + 10
    while True:
        now = scrape(port)
        moved = {name: total(now, name) - total(before, name) for name, _ in counters}
        if all(moved[n] >= workload[w] for n, w in counters) or time.monotonic() > deadline:
            return moved
        time.sleep(0.1)


@contextmanager
def sglang_http_server(model: Path) -> Iterator[int]:
    """SGLang's own OpenAI HTTP server on the same model and CPU flags, metrics on: its port."""
    from smg_servicer_sglang.testing import CPU_ENV, CPU_FLAGS

    port = free_port()
    cmd = [str(sglang_python()), "-m", "sglang.launch_server", "--model-path", str(model),
           *CPU_FLAGS, "--enable-metrics", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with Worker(cmd, port, start_timeout_s=240, env=CPU_ENV):
        yield port


def _defined(python: Path, module: str, prefix: str) -> set[str]:
    """The metric names ``module`` defines (``name="prefix..."``), read from its source in the
    environment of ``python``; counters as their families (no ``_total``)."""
    from smg_servicer_sglang.testing import CPU_ENV  # SGLang imports its CPU paths only so

    where = subprocess.run(
        [str(python), "-c", f"import importlib.util as u; print(u.find_spec({module!r}).origin)"],
        check=True, capture_output=True, text=True, timeout=60, env={**os.environ, **CPU_ENV},
    ).stdout.strip()  # fmt: skip
    names = re.findall(rf'name="({re.escape(prefix)}[a-z0-9_:]+)"', Path(where).read_text())
    return {name.removesuffix("_total") for name in names}


def sglang_http_layer_families() -> set[str]:
    """The families SGLang's HTTP layer defines (``sglang.srt.observability.http_request_metrics``:
    HTTP requests and responses, routing keys), which a gRPC worker has no HTTP layer to count."""
    module = "sglang.srt.observability.http_request_metrics"
    return _defined(sglang_python(), module, "sglang:")


def tokenspeed_families() -> set[str]:
    """Every ``tokenspeed:*`` family TokenSpeed defines (its metrics module): TokenSpeed has no
    HTTP server of its own to compare with, so its definitions are the reference."""
    return _defined(tokenspeed_python(), "tokenspeed.runtime.metrics.collector", "tokenspeed:")

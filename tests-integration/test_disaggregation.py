"""SGLang prefill and decode workers behind the router's PD mode (``--pd-disaggregation
--prefill grpc://… <bootstrap port> --decode grpc://…``), Mooncake as the KV transfer backend.

The router registers both workers (through their discovery calls, answered without a peer) and
sends a request to both with its bootstrap fields. SGLang's CPU build cannot move the KV: its
prefill scheduler dies sending the first chunk. The last test pins that engine error: it fails
once SGLang's CPU build can run a transfer, so the round trip can be tested here. The workers'
own PD behaviour: packages/smg-servicer-sglang/tests/test_disaggregation.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smg_it.harness import Worker, free_port, sglang_worker
from smg_servicer_core.testing.router import Router
from smg_servicer_sglang.testing import PD_CPU_FLAGS

pytestmark = pytest.mark.integration

#: SGLang's own error when its CPU build sends KV (``disaggregation/prefill.py``).
CPU_TRANSFER_ERROR = "pin_memory=True requires a CUDA or other accelerator backend"


@pytest.fixture(scope="module")
def bootstrap_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def pd_workers(tiny_model: Path, bootstrap_port: int) -> Iterator[dict[str, Worker]]:
    workers = {
        "prefill": sglang_worker(
            tiny_model, free_port(), *PD_CPU_FLAGS["prefill"],
            "--disaggregation-bootstrap-port", str(bootstrap_port),
        ),
        "decode": sglang_worker(tiny_model, free_port(), *PD_CPU_FLAGS["decode"]),
    }  # fmt: skip
    try:
        for worker in workers.values():
            worker.start()
        for worker in workers.values():
            assert worker.process is not None
            worker.process.wait_serving(worker.start_timeout_s)
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()


def test_the_router_registers_both_and_sglangs_cpu_build_cannot_move_the_kv(
    pd_workers: dict[str, Worker], bootstrap_port: int, tiny_model: Path
) -> None:
    prefill, decode = pd_workers["prefill"], pd_workers["decode"]
    with Router(
        prefill.url, "--pd-disaggregation",
        "--prefill", prefill.url, str(bootstrap_port), "--decode", decode.url,
    ) as router:  # fmt: skip
        workers = httpx.get(router.base + "/workers", timeout=10).json()["workers"]
        types = {w["url"]: w["worker_type"] for w in workers}
        assert types == {prefill.url: "prefill", decode.url: "decode"}, types
        reply = httpx.post(
            router.base + "/v1/completions",
            json={"model": str(tiny_model), "prompt": "hello there", "max_tokens": 4},
            timeout=120,
        )
    # The request reached the prefill scheduler with the router's bootstrap fields; SGLang's
    # CPU build died sending its KV, which the worker reports as an engine death (exit 1).
    assert reply.status_code >= 500, reply.text
    assert prefill.proc is not None and prefill.proc.wait(timeout=30) == 1
    assert CPU_TRANSFER_ERROR in prefill.log.read_text()
    assert decode.proc is not None and decode.proc.poll() is None  # the decode side is unharmed

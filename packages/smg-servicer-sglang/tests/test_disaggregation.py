"""Prefill and decode workers (``--disaggregation-mode prefill|decode``) on SGLang CPU, with
Mooncake as the KV transfer backend (its non-CUDA build over TCP; SGLang refuses a prefill
worker on the ``fake`` backend: "Prefill server does not support 'fake' as the transfer
backend").

What SGLang does in the part this servicer replaces, done here: the prefill worker runs
SGLang's KV bootstrap server (its prefill rank registers with it), and the warm-up request and
the deep health probe carry SGLang's local-only bootstrap host, so they run on the worker alone
instead of waiting for a peer (or, with no bootstrap room, killing the scheduler). A request
without its transfer fields is refused before it reaches the scheduler, which died on one.

What SGLang's CPU build cannot do on its own is the transfer itself: the prefill scheduler dies
sending the first KV chunk (``RuntimeError: pin_memory=True requires a CUDA or other accelerator
backend``). The last test pins that failure, which users of the CPU build meet (these workers run
without the test environment's pin-memory shim); tests-integration/test_disaggregation.py runs
the transfer with the shim, through the router."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc.aio
import httpx
import pytest

from smg_it.harness import free_port
from smg_it.sglang_suite import Server, start_server
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_servicer_sglang.testing import PD_CPU_FLAGS

#: SGLang's own error when its CPU build sends KV (``disaggregation/prefill.py``).
CPU_TRANSFER_ERROR = "pin_memory=True requires a CUDA or other accelerator backend"

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def bootstrap_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def pd_servers(tiny_model: Path, bootstrap_port: int) -> Iterator[dict[str, Server]]:
    # Each worker's torch rendezvous port (--nccl-port) from the kit's free ports, below the
    # ephemeral range: SGLang's own pick is an ephemeral port it frees before its TCP store binds
    # it, and a gate run lost the prefill worker to another connection taking it (EADDRINUSE).
    servers = {
        "prefill": start_server(
            tiny_model, *PD_CPU_FLAGS["prefill"],
            "--disaggregation-bootstrap-port", str(bootstrap_port),
            "--nccl-port", str(free_port()),
        ),
        "decode": start_server(
            tiny_model, *PD_CPU_FLAGS["decode"], "--nccl-port", str(free_port())
        ),
    }  # fmt: skip
    try:
        for server in servers.values():
            server.wait_serving()  # warm-up on: it went through each worker alone
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def test_the_prefill_worker_runs_sglangs_bootstrap_server(
    pd_servers: dict[str, Server], bootstrap_port: int
) -> None:
    """SGLang's bootstrap server answers on ``--disaggregation-bootstrap-port`` with the prefill
    rank that registered with it (it answers 503 until every rank has)."""
    base = f"http://127.0.0.1:{bootstrap_port}"
    assert httpx.get(base + "/health", timeout=5).text == "OK"
    ranks = {"prefill_dp_rank": -1, "prefill_cp_rank": -1, "target_tp_rank": -1}
    info = httpx.get(base + "/route", params={**ranks, "target_pp_rank": -1}, timeout=5)
    assert info.status_code == 200, info.text
    assert json.loads(info.text)["dp_size"] == 1


async def _refused_then_healthy(address: str) -> tuple[grpc.StatusCode, str, bool]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        request = pb.GenerateRequest(
            request_id="no-transfer",
            tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=pb.SamplingParams(max_new_tokens=2),
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Generate(request):
                pass
        health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=20)
        return refused.value.code(), refused.value.details() or "", health.healthy


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_request_without_its_transfer_is_refused_and_the_worker_stays_healthy(
    pd_servers: dict[str, Server], role: str
) -> None:
    """No ``disaggregated_params``: INVALID_ARGUMENT before the scheduler (SGLang's scheduler
    raised on it and died); the deep health probe, local to the worker, still passes."""
    code, details, healthy = asyncio.run(_refused_then_healthy(pd_servers[role].address))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "disaggregated_params" in details
    assert healthy
    assert pd_servers[role].proc.poll() is None


async def _one_transfer(servers: dict[str, Server], bootstrap_port: int) -> list[object]:
    """One request to both workers with the transfer fields the router's PD mode sends."""
    params = pb.DisaggregatedParams(
        bootstrap_host="127.0.0.1", bootstrap_port=bootstrap_port, bootstrap_room=4242
    )

    async def one(role: str) -> object:
        async with grpc.aio.insecure_channel(servers[role].address) as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            request = pb.GenerateRequest(
                request_id=f"pd-{role}",
                tokenized=pb.TokenizedInput(input_ids=[1, 2, 3, 4]),
                sampling_params=pb.SamplingParams(max_new_tokens=4, temperature=0.0),
                disaggregated_params=params,
            )
            try:
                return [r async for r in stub.Generate(request, timeout=60)]
            except grpc.aio.AioRpcError as err:
                return err.code()

    return list(await asyncio.gather(one("prefill"), one("decode")))


def test_sglangs_cpu_build_dies_moving_the_kv_without_the_shim(
    pd_servers: dict[str, Server], bootstrap_port: int
) -> None:
    """The failure a user of SGLang's CPU build meets (last: it ends the prefill worker): the
    prefill scheduler dies on the first KV chunk with SGLang's own message; our worker reports
    the engine's death (exit 1) and the decode worker is unharmed."""
    prefill, decode = pd_servers["prefill"], pd_servers["decode"]
    asyncio.run(_one_transfer(pd_servers, bootstrap_port))
    assert prefill.proc is not None and prefill.proc.wait(timeout=60) == 1
    assert CPU_TRANSFER_ERROR in prefill.log.read_text()
    assert decode.proc is not None and decode.proc.poll() is None

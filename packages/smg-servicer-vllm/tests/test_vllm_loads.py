"""``GetLoads`` per DP rank (issue #25; the rules smg#2429 asked for, as the maintained fork
applies them): one entry per managed rank with stats, the ``dp_rank`` filter honoured, an
unmanaged rank INVALID_ARGUMENT, a rank without stats or with stats that cannot be true left out
(never reported idle: the router would send its next requests there), capacity as the engine
sizes it and waiting with the deferred requests where vLLM counts them apart.

The fake engine is shaped like vLLM's: a ``StatLoggerManager`` with ``engine_indexes`` and its
per-rank ``LoggingStatLogger``s (or the aggregated one), each rank's ``SchedulerStats`` recorded
through ``logger_manager.record(stats, None, engine_idx=rank)`` as vLLM's output handler does;
:func:`test_the_fakes_stat_loggers_are_shaped_like_vllms` holds it to vLLM's own classes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc
import pytest

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.loads import LoadSnapshot
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_vllm import info
from smg_servicer_vllm.testing.fake_llm import (
    FakeAggregatedLoggingStatLogger,
    FakeAsyncLLM,
    FakeEngineCoreClient,
    FakeLoggingStatLogger,
    FakePerEngineStatLoggerAdapter,
    FakePrometheusStatLogger,
    FakeSchedulerStats,
    FakeStatLoggerManager,
)

SESSION = pytest.mark.asyncio(loop_scope="session")
Serve = Callable[[Any], AbstractAsyncContextManager[tuple[Any, Any]]]
IDLE = LoadSnapshot(gen_throughput=0.0, cache_hit_rate=0.0, tokens_in_window=0)
#: The fake's KV cache: 1024 blocks of 16 tokens, sized as one group by vLLM 0.24+.
BLOCKS_TIMES_SIZE = 1024 * 16


def two_ranks(**options: Any) -> FakeAsyncLLM:
    """A frontend managing DP ranks 0 and 1, each with its own stats: rank 0 busy (3 running, 2
    waiting and 1 deferred, half the cache), rank 1 light (1 running, a quarter)."""
    engine = FakeAsyncLLM(data_parallel_size=2, **options)
    record(engine, 0, FakeSchedulerStats(3, 2, 1, 0.5))
    record(engine, 1, FakeSchedulerStats(1, 0, 0, 0.25))
    return engine


def record(engine: FakeAsyncLLM, rank: int, stats: Any) -> None:
    """What vLLM's output handler does with each engine core's stats, from an engine that is
    busy: its frontend holds an unfinished request (an idle frontend's ranks are idle whatever
    their last stats say: ``test_an_idle_frontends_ranks_are_idle_whatever_their_last_stats``)."""
    assert engine.logger_manager is not None
    engine.logger_manager.record(stats, None, engine_idx=rank)
    engine.output_processor.running.add(f"held-by-rank-{rank}")


def entries(response: pb.GetLoadsResponse) -> dict[int, tuple[int, int, int, float]]:
    return {
        load.dp_rank: (
            load.num_running_reqs,
            load.num_waiting_reqs,
            load.num_total_reqs,
            load.token_usage,
        )
        for load in response.loads
    }


async def get_loads(stub: Any, dp_rank: int | None = None) -> pb.GetLoadsResponse:
    request = pb.GetLoadsRequest() if dp_rank is None else pb.GetLoadsRequest(dp_rank=dp_rank)
    return await stub.GetLoads(request)


# Over the wire -----------------------------------------------------------------------------------


@pytest.mark.contract
@SESSION
async def test_each_managed_rank_reports_its_own_stats(serve_llm: Serve) -> None:
    """The router scores each rank (``--dp-aware``) by its own entry: two ranks with different
    loads must not read alike, nor as the frontend's total on rank 0."""
    async with serve_llm(two_ranks()) as (_, stub):
        response = await get_loads(stub)
    # rank 0's waiting counts its deferred request (vLLM 0.20+ keeps it apart)
    assert entries(response) == {0: (3, 3, 6, 0.5), 1: (1, 0, 1, 0.25)}
    assert response.dp_rank_count == 2 and response.version and response.timestamp
    busy, light = response.loads
    assert (busy.max_total_num_tokens, busy.num_used_tokens) == (BLOCKS_TIMES_SIZE, 8192)
    assert (light.max_total_num_tokens, light.num_used_tokens) == (BLOCKS_TIMES_SIZE, 4096)
    assert busy.utilization == busy.token_usage and busy.max_running_requests == 256


@pytest.mark.contract
@SESSION
async def test_dp_rank_selects_that_rank_only(serve_llm: Serve) -> None:
    """The router polls one rank per router worker with ``dp_rank``."""
    async with serve_llm(two_ranks()) as (_, stub):
        response = await get_loads(stub, dp_rank=1)
        first = await get_loads(stub, dp_rank=0)
    assert entries(response) == {1: (1, 0, 1, 0.25)} and response.dp_rank_count == 1
    assert entries(first) == {0: (3, 3, 6, 0.5)}


@pytest.mark.contract
@SESSION
@pytest.mark.parametrize("rank", [5, 2, -1])
async def test_an_unmanaged_rank_is_invalid_argument(serve_llm: Serve, rank: int) -> None:
    """A rank outside this frontend (another process's, or none) is the caller's mistake, said
    as such, not an empty answer that reads as a rank with no data yet."""
    async with serve_llm(two_ranks()) as (_, stub):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await get_loads(stub, dp_rank=rank)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"DP rank {rank} is not managed by this engine"


@pytest.mark.contract
@SESSION
async def test_a_managed_rank_without_stats_is_left_out_not_idle(serve_llm: Serve) -> None:
    """vLLM's stat logging below INFO keeps only Prometheus, which caches nothing to read back:
    both ranks are managed, neither has stats. An empty answer (asking for a rank too), never
    a zero-filled entry and never INVALID_ARGUMENT for a rank that is ours."""
    engine = FakeAsyncLLM(data_parallel_size=2)
    engine.logger_manager = FakeStatLoggerManager([0, 1], default_loggers=False)
    record(engine, 1, FakeSchedulerStats(4, 0, 0, 0.5))  # Prometheus exports it, keeps nothing
    async with serve_llm(engine) as (_, stub):
        everything = await get_loads(stub)
        one = await get_loads(stub, dp_rank=1)
    assert (list(everything.loads), everything.dp_rank_count) == ([], 0)
    assert (list(one.loads), one.dp_rank_count) == ([], 0)


@pytest.mark.contract
@SESSION
async def test_without_stat_logging_no_rank_is_reported(serve_llm: Serve) -> None:
    """``--disable-log-stats``: no stat logger manager. The engine client still says which ranks
    are ours (a rank outside them is refused), but nothing says how loaded they are, and the
    frontend's count of unfinished requests does not say which rank runs them or what waits."""
    engine = FakeAsyncLLM(data_parallel_size=2, log_stats=False)
    async with serve_llm(engine) as (_, stub):
        assert list((await get_loads(stub)).loads) == []
        assert list((await get_loads(stub, dp_rank=1)).loads) == []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await get_loads(stub, dp_rank=2)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.contract
@SESSION
async def test_a_rank_with_impossible_stats_is_left_out(serve_llm: Serve) -> None:
    """A NaN usage on the wire would poison the router's scores; the other rank still reports."""
    engine = two_ranks()
    record(engine, 1, FakeSchedulerStats(1, 0, 0, float("nan")))
    async with serve_llm(engine) as (_, stub):
        response = await get_loads(stub)
        one = await get_loads(stub, dp_rank=1)
    assert entries(response) == {0: (3, 3, 6, 0.5)} and response.dp_rank_count == 1
    assert list(one.loads) == []


@pytest.mark.contract
@SESSION
async def test_a_request_shows_on_the_rank_that_runs_it(serve_llm: Serve) -> None:
    """The fake's engine records every rank's stats after each step, as vLLM's engine cores
    send theirs: a request pinned to rank 1 is running on rank 1's entry, not rank 0's."""
    engine = FakeAsyncLLM(data_parallel_size=2, token_delay_s=0.01)
    request = generate_request("vllm", [1, 2, 3], max_tokens=500, ignore_eos=True, stream=True)
    request.data_parallel_rank = 1
    async with serve_llm(engine) as (_, stub):
        call = stub.Generate(request)
        await call.read()
        await asyncio.sleep(0.05)  # a step or two after the first output
        busy = entries(await get_loads(stub))
        call.cancel()
    assert busy[1][0] == 1 and busy[1][3] > 0
    assert busy[0] == (0, 0, 0, 0.0)


@pytest.mark.contract
@SESSION
async def test_an_aborted_last_request_leaves_its_rank_idle_not_running(serve_llm: Serve) -> None:
    """vLLM drops an aborted request without a step, so when it was the last one running its
    rank's last stats still count it, and nothing refreshes them while the engine idles (the fake
    does the same). The frontend holds nothing: ``GetLoads`` and ``/metrics`` say idle."""
    engine = FakeAsyncLLM(data_parallel_size=2, token_delay_s=0.01)
    request = generate_request("vllm", [1, 2, 3], max_tokens=500, ignore_eos=True, stream=True)
    request.data_parallel_rank = 1
    async with serve_llm(engine) as (servicer, stub):
        call = stub.Generate(request)
        await call.read()  # the step that made it recorded its stats before it was read
        running = info.scheduler_stats(engine)[1].num_running_reqs
        await stub.Abort(pb.AbortRequest(request_ids=[request.request_id]))
        while await call.read() is not grpc.aio.EOF:  # the stream ends (its abort output)
            pass
        stale = info.scheduler_stats(engine)[1]
        idle = entries(await get_loads(stub))
        gauges = servicer.engine_loads()()
    assert running == stale.num_running_reqs == 1  # what the rank's last stats still say
    assert idle == {0: (0, 0, 0, 0.0), 1: (0, 0, 0, 0.0)}
    assert [(g.dp_rank, g.running, g.waiting) for g in gauges] == [(0, 0, 0), (1, 0, 0)]


@pytest.mark.unit
def test_an_idle_frontends_ranks_are_idle_whatever_their_last_stats() -> None:
    """Last stats that count requests the frontend no longer holds (the last step's, recorded
    after its outputs were read, or an abort's) are old: with no unfinished request every rank
    with stats is idle."""
    engine = FakeAsyncLLM(data_parallel_size=2)
    record(engine, 0, FakeSchedulerStats(3, 2, 1, 0.5))
    record(engine, 1, FakeSchedulerStats(1, 0, 0, 0.25))
    busy = entries(info.loads(engine, IDLE, None, "v"))
    engine.output_processor.running.clear()
    idle = info.loads(engine, IDLE, None, "v")
    assert busy == {0: (3, 3, 6, 0.5), 1: (1, 0, 1, 0.25)}
    assert entries(idle) == {0: (0, 0, 0, 0.0), 1: (0, 0, 0, 0.0)}
    assert [load.num_used_tokens for load in idle.loads] == [0, 0]
    assert idle.dp_rank_count == 2


# The rules, one at a time ----------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("stats", "why"),
    [
        (FakeSchedulerStats(1, 0, 0, float("nan")), "usage NaN"),
        (FakeSchedulerStats(1, 0, 0, float("inf")), "usage infinite"),
        (FakeSchedulerStats(1, 0, 0, -0.01), "usage negative"),
        (FakeSchedulerStats(1, 0, 0, 1.5), "usage above 1"),
        (FakeSchedulerStats(-1, 0, 0, 0.5), "running negative"),
        (FakeSchedulerStats(1, -2, 0, 0.5), "waiting negative"),
        (FakeSchedulerStats(1, 0, -1, 0.5), "skipped-waiting negative"),
        (FakeSchedulerStats(2**31, 0, 0, 0.5), "running beyond int32"),
        (FakeSchedulerStats(2**31 - 1, 1, 0, 0.5), "total beyond int32"),
        (FakeSchedulerStats(1.0, 0, 0, 0.5), "running not an int"),  # type: ignore[arg-type]
        (FakeSchedulerStats(True, 0, 0, 0.5), "running a bool"),
        (FakeSchedulerStats(1, 0, 0, None), "usage missing"),  # type: ignore[arg-type]
        (object(), "no counts at all"),
        (None, "no stats"),
    ],
)
def test_stats_that_cannot_be_true_are_no_stats(stats: Any, why: str) -> None:
    """Counts the wire cannot carry (int32) or no engine reports, usage outside [0, 1]: the rank
    is left out, never clamped into something that looks true."""
    assert info.rank_counts(stats) is None, why
    engine = two_ranks()
    record(engine, 1, stats)
    if stats is not None:  # vLLM records only a rank's real stats; None leaves the last one
        assert entries(info.loads(engine, IDLE, None, "v")) == {0: (3, 3, 6, 0.5)}, why


@pytest.mark.unit
def test_the_edges_of_the_valid_range_are_reported() -> None:
    """An idle rank that says so, a full cache, the largest counts the wire carries."""
    assert info.rank_counts(FakeSchedulerStats(0, 0, 0, 0.0)) == (0, 0, 0.0)
    assert info.rank_counts(FakeSchedulerStats(2, 1, 0, 1)) == (2, 1, 1.0)
    assert info.rank_counts(FakeSchedulerStats(2**31 - 2, 1, 0, 1.0)) == (2**31 - 2, 1, 1.0)


@pytest.mark.unit
def test_waiting_adds_the_deferred_requests_where_vllm_counts_them_apart() -> None:
    """vLLM 0.20+ keeps deferred waiting requests out of ``num_waiting_reqs`` and adds them back
    in its own logging; a rank whose queue is all deferred is not empty."""
    assert info.rank_counts(FakeSchedulerStats(1, 2, 5, 0.5)) == (1, 7, 0.5)

    class SchedulerStats019:
        """0.19's ``SchedulerStats``: no ``num_skipped_waiting_reqs``."""

        num_running_reqs = 1
        num_waiting_reqs = 2
        kv_cache_usage = 0.5

    assert info.rank_counts(SchedulerStats019()) == (1, 2, 0.5)


@pytest.mark.unit
def test_capacity_is_the_engines_group_aware_size_where_the_release_has_it() -> None:
    """For a hybrid model blocks x block size overstates what fits; vLLM 0.24+ says it."""
    engine = two_ranks()
    cache = engine.vllm_config.cache_config
    cache.kv_cache_size_tokens = 6000  # a hybrid model: fewer tokens fit than blocks x size
    sized = info.loads(engine, IDLE, 0, "v").loads[0]
    assert (sized.max_total_num_tokens, sized.num_used_tokens) == (6000, 3000)
    cache.kv_cache_size_tokens = None  # 0.24+ before the KV cache is sized
    unsized = info.loads(engine, IDLE, 0, "v").loads[0]
    assert (unsized.max_total_num_tokens, unsized.num_used_tokens) == (BLOCKS_TIMES_SIZE, 8192)
    del cache.kv_cache_size_tokens  # 0.19-0.23
    older = info.loads(engine, IDLE, 0, "v").loads[0]
    assert (older.max_total_num_tokens, older.num_used_tokens) == (BLOCKS_TIMES_SIZE, 8192)
    cache.num_gpu_blocks = None  # not sized at all: capacity unknown, the counts still true
    unknown = info.loads(engine, IDLE, 0, "v").loads[0]
    assert (unknown.max_total_num_tokens, unknown.num_used_tokens) == (0, 0)
    assert (unknown.num_running_reqs, unknown.token_usage) == (3, 0.5)


@pytest.mark.unit
def test_the_aggregated_logger_gives_each_ranks_own_stats_not_the_sum() -> None:
    """``--aggregate-engine-logging``: the logger's own stats are every rank's sum."""
    engine = two_ranks(aggregate_engine_logging=True)
    assert engine.logger_manager is not None
    aggregated = engine.logger_manager.stat_loggers[0]
    assert isinstance(aggregated, FakeAggregatedLoggingStatLogger)
    assert aggregated.last_scheduler_stats.num_running_reqs == 4  # what vLLM logs: the sum
    assert entries(info.loads(engine, IDLE, None, "v")) == {0: (3, 3, 6, 0.5), 1: (1, 0, 1, 0.25)}


@pytest.mark.unit
def test_the_managed_ranks_are_the_frontends_slice_not_the_configured_size() -> None:
    """External or hybrid load balancing: four DP ranks, this frontend manages 2 and 3."""
    engine = FakeAsyncLLM(data_parallel_size=4)
    engine.logger_manager = FakeStatLoggerManager([2, 3])
    engine.engine_core = FakeEngineCoreClient(engine_ranks_managed=[2, 3])
    record(engine, 3, FakeSchedulerStats(2, 0, 0, 0.5))
    assert info.managed_ranks(engine) == [2, 3]
    with pytest.raises(InvalidRequest, match="DP rank 0 is not managed by this engine"):
        info.loads(engine, IDLE, 0, "v")
    # rank 2 still has the stats vLLM seeds its loggers with: nothing has run there
    assert entries(info.loads(engine, IDLE, None, "v")) == {2: (0, 0, 0, 0.0), 3: (2, 0, 2, 0.5)}
    engine.logger_manager = None  # --disable-log-stats: the engine client says the same
    assert info.managed_ranks(engine) == [2, 3]
    del engine.engine_core  # nothing says: with DP > 1 no rank is known to be ours
    assert info.managed_ranks(engine) == []
    engine.vllm_config.parallel_config.data_parallel_size = 1
    engine.vllm_config.parallel_config.data_parallel_rank = 0
    assert info.managed_ranks(engine) == [0]  # one rank: the configuration's


@pytest.mark.unit
def test_the_load_record_follows_the_getloads_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KV batch's load record is its rank's GetLoads entry, or none: no stats, or a publisher
    rank this frontend does not manage (no error from the record: the batch goes on)."""
    from smg_servicer_vllm.servicer import VllmEngineServicer

    monkeypatch.delenv("SMG_VLLM_SERVICER_METRICS_PORT", raising=False)
    engine = two_ranks()
    record(engine, 1, FakeSchedulerStats(1, 0, 0, 2.0))
    servicer = VllmEngineServicer(engine, 0.0)
    made = servicer._load_record(0)  # pyright: ignore[reportPrivateUsage]
    assert made is not None
    assert (made.running_requests, made.waiting_requests, made.token_usage) == (3, 3, 0.5)
    assert servicer._load_record(1) is None  # pyright: ignore[reportPrivateUsage]
    assert servicer._load_record(7) is None  # pyright: ignore[reportPrivateUsage]


@pytest.mark.unit
def test_metrics_show_the_frontends_count_only_without_stat_logging() -> None:
    """``/metrics`` keeps showing whether the engine holds requests under
    ``--disable-log-stats`` (the launcher our integration tests run); with stat logging, a rank
    without stats shows nothing there either."""
    blind = FakeAsyncLLM(log_stats=False)
    blind.output_processor.running.update({"a", "b"})
    (load,) = info.engine_load(blind, info.loads(blind, IDLE, None, "v"))
    assert (load.running, load.waiting, load.dp_rank) == (2, 0, None)  # for no rank in particular
    quiet = FakeAsyncLLM()
    quiet.logger_manager = FakeStatLoggerManager([0], default_loggers=False)
    assert info.engine_load(quiet, info.loads(quiet, IDLE, None, "v")) == []
    ranks = info.engine_load(two_ranks(), info.loads(two_ranks(), IDLE, None, "v"))
    shown = [(r.dp_rank, r.running, r.waiting, r.kv_cache_usage) for r in ranks]
    assert len(shown) == 2 and sum(s[1] for s in shown) == 4 and sum(s[2] for s in shown) == 3
    assert [s[0] for s in shown] == [0, 1] and max(s[3] for s in shown) == 0.5


# The fake is vLLM's shape ------------------------------------------------------------------------


@pytest.mark.conformance
def test_the_fakes_stat_loggers_are_shaped_like_vllms() -> None:
    """Every attribute the fake's stat loggers, stats and engine client carry is a member of the
    vLLM class it stands in for, in the newest release read (its cached wheel sources; the
    index only when not cached): the fake cannot grow a shape vLLM does not have."""
    from smg_it.compat import VLLM_READ
    from smg_it.paths import CACHE
    from smg_it.wheel_sources import SourceTree, WheelSources

    loggers = "vllm.v1.metrics.loggers"
    shapes: list[tuple[Any, str]] = [
        (FakeSchedulerStats(), "vllm.v1.metrics.stats:SchedulerStats"),
        (FakeLoggingStatLogger(0), f"{loggers}:LoggingStatLogger"),
        (FakeAggregatedLoggingStatLogger([0, 1]), f"{loggers}:AggregatedLoggingStatLogger"),
        (FakePerEngineStatLoggerAdapter([0, 1]), f"{loggers}:PerEngineStatLoggerAdapter"),
        (FakePrometheusStatLogger([0, 1]), f"{loggers}:PrometheusStatLogger"),
        (FakeStatLoggerManager([0, 1]), f"{loggers}:StatLoggerManager"),
        (FakeEngineCoreClient([0, 1]), "vllm.v1.engine.core_client:MPClient"),
        (FakeAsyncLLM(), "vllm.v1.engine.async_llm:AsyncLLM"),
    ]
    version = max(VLLM_READ, key=lambda v: tuple(int(p) for p in v.split(".")))
    sources = WheelSources(VLLM_READ[version], version, CACHE / "vllm-api")
    try:
        tree = SourceTree(sources)
        missing: list[str] = []
        for fake, where in shapes:
            module, _, name = where.partition(":")
            cls = tree.lookup(module, name)
            assert cls is not None, f"vllm {version} has no {where}"
            names = [n for n in vars(fake) if not n.startswith("_")]
            if not isinstance(fake, FakeAsyncLLM):  # its other members: the servicer's tests
                names += [n for n in dir(type(fake)) if not n.startswith("_")]
            else:
                names = ["logger_manager", "engine_core"]
            missing += [f"{where}.{n}" for n in names if tree.attribute(cls, n) is None]
    finally:
        sources.close()
    assert not missing, f"vllm {version} lacks what the fake has: {missing}"

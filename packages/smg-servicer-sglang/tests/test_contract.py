"""The servicer against a scripted scheduler (SGLang's own IPC frames): the faults the real
scheduler cannot be made to show on demand. The engine tests cover the same RPCs for real."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.figures import record
from smg_it.sglang_scheduler import FakeScheduler, port_args, token_output
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing import RunningServer, running_server
from smg_servicer_core.testing.health import (
    assert_health_follows_probe,
    assert_not_serving_from_shutdown,
)
from smg_servicer_kv_bridge.testing import EXPECTED, ScriptedPublisher, kv_fault_outcomes
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang import server as server_mod
from smg_servicer_sglang.request_manager import RequestManager
from smg_servicer_sglang.servicer import SERVICE_NAME, SglangServicer

pytestmark = [pytest.mark.contract, pytest.mark.asyncio(loop_scope="function")]

FACTS = {
    "vocab_size": 100,
    "context_length": 64,
    "is_generation": True,
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "eos_token_ids": [2],
    "pad_token_id": 0,
    "bos_token_id": 1,
    "num_labels": 0,
    "id2label": {},
}


@dataclass
class Stack:
    srv: RunningServer
    stub: pb_grpc.SglangSchedulerStub
    health: Any  # grpc_health's stub has no typed methods
    scheduler: FakeScheduler
    manager: RequestManager
    servicer: SglangServicer


class _Config:
    model_path = "/nonexistent"
    tokenizer_path = ""
    preferred_sampling_params = None
    served_model_name = "fake"
    weight_version = "default"
    kv_events_config: str | None = None


@contextlib.asynccontextmanager
async def make_stack(config: Any = None) -> AsyncIterator[Stack]:
    """The servicer over a scripted scheduler, served on a real port, warmed up."""
    args = port_args()
    manager = RequestManager(args, stall_after_s=1.0)
    scheduler = FakeScheduler(args)
    scheduler.start()
    manager.start()
    health = HealthFrame(SERVICE_NAME)
    servicer = SglangServicer(
        manager,
        server_args=None,
        config=config if config is not None else _Config(),
        scheduler_info={"max_total_num_tokens": 1000},
        facts=FACTS,
        health=health,
        health_timeout_s=1.5,
    )
    launched = sg.Launched(port_args=args, scheduler_info={}, processes=[], dp_size=1)
    lifecycle = server_mod.Schedulers(launched, manager, servicer, health, warmup=True)
    async with running_server(
        [servicer.binding()], health, lifecycle, in_flight=lambda: len(servicer.registry)
    ) as srv:
        built = Stack(
            srv,
            pb_grpc.SglangSchedulerStub(srv.channel),
            health_pb2_grpc.HealthStub(srv.channel),
            scheduler,
            manager,
            servicer,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while await engine_status(built) != health_pb2.HealthCheckResponse.SERVING:
            assert loop.time() < deadline, "the warm-up never finished"
            await asyncio.sleep(0.05)
        yield built
    await scheduler.close()


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[Stack]:
    async with make_stack() as built:
        yield built


def gen(rid: str, stream: bool = True) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(max_new_tokens=3),
        stream=stream,
    )


async def engine_status(stack: Stack) -> int:
    reply = await stack.health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    return reply.status


async def test_warm_up_gates_serving_then_streams(stack: Stack) -> None:
    """The lifecycle warm-up went through the fake scheduler before SERVING."""
    assert any(getattr(o, "rid", "").startswith("WARMUP") for o in stack.scheduler.received)
    assert await engine_status(stack) == health_pb2.HealthCheckResponse.SERVING
    responses = [r async for r in stack.stub.Generate(gen("a"))]
    chunks = [list(r.chunk.token_ids) for r in responses[:-1]]
    # Outputs that arrive while the reader is busy go out together: nothing is lost or reordered.
    assert [t for c in chunks for t in c] == [11, 12, 13]
    assert all(chunks)
    assert responses[-1].complete.finish_reason == "length"
    assert responses[-1].complete.completion_tokens == 3


async def test_metrics_that_fail_stop_alone_and_the_request_is_served(stack: Stack) -> None:
    """SGLang's own metrics (``--enable-metrics``) that raise are switched off with a warning;
    the scheduler stream, the request and health go on."""
    from smg_servicer_sglang.engine_metrics import RequestMetrics

    class _Broken:
        labels: dict[str, str] = {}

        def observe_time_to_first_token(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a collector that broke")

        def observe_one_finished_request(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a collector that broke")

    stack.manager.metrics = RequestMetrics(_Broken())
    responses = [r async for r in stack.stub.Generate(gen("m"))]
    assert responses[-1].complete.completion_tokens == 3
    assert stack.manager.metrics is None
    assert await engine_status(stack) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (503, grpc.StatusCode.UNAVAILABLE),
        (500, grpc.StatusCode.INTERNAL),
    ],
)
async def test_scheduler_refusal_maps_status(stack: Stack, status: int, code: Any) -> None:
    stack.scheduler.mode = "refuse"
    stack.scheduler.refuse_status = status
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stack.stub.Generate(gen("refused"))]
    assert err.value.code() == code
    assert "refused" in (err.value.details() or "") or code == grpc.StatusCode.INTERNAL
    assert len(stack.servicer.registry) == 0


async def test_silent_scheduler_turns_not_serving_and_back(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    call = stack.stub.Generate(gen("stuck"))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await engine_status(stack) == health_pb2.HealthCheckResponse.SERVING:
        assert loop.time() < deadline, "never turned NOT_SERVING"
        await asyncio.sleep(0.2)
    liveness = await stack.health.Check(health_pb2.HealthCheckRequest(service=""))
    assert liveness.status == health_pb2.HealthCheckResponse.NOT_SERVING  # one health
    deep = await stack.stub.HealthCheck(pb.HealthCheckRequest())
    assert not deep.healthy
    assert "silent" in deep.message
    # The scheduler answers again: SERVING again, and the request completes.
    await stack.scheduler.send(token_output("stuck", [7], 1, {"type": "length", "length": 1}))
    responses = [r async for r in call]
    assert responses[-1].complete.finish_reason == "length"
    deadline = loop.time() + 10
    while await engine_status(stack) != health_pb2.HealthCheckResponse.SERVING:
        assert loop.time() < deadline, "never came back to SERVING"
        await asyncio.sleep(0.2)


async def test_deep_health_probe_times_out_on_silence(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    reply = await stack.stub.HealthCheck(pb.HealthCheckRequest())
    assert not reply.healthy
    assert "did not answer" in reply.message
    assert stack.manager.active == 0  # the probe cleaned up after itself
    # ...and told the scheduler to drop the probe.
    for _ in range(40):
        if isinstance(stack.scheduler.received[-1], sg.AbortReq):
            break
        await asyncio.sleep(0.05)
    assert isinstance(stack.scheduler.received[-1], sg.AbortReq)
    assert stack.scheduler.received[-1].rid.startswith("HEALTH_CHECK_")


async def test_unreadable_frame_fails_requests_and_health(stack: Stack) -> None:
    stack.scheduler.mode = "garbage"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stack.stub.Generate(gen("g"))]
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "\\xc1" not in (err.value.details() or "")  # no raw exception text
    reply = await stack.stub.HealthCheck(pb.HealthCheckRequest())
    assert not reply.healthy
    await asyncio.wait_for(stack.srv.task, 10)  # the lifecycle reports the engine dead
    assert stack.srv.task.result() == 1


async def test_shutdown_fails_pending_requests_unavailable(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    call = stack.stub.Generate(gen("pending"))
    await asyncio.sleep(0.3)
    stop = asyncio.create_task(stack.srv.stop())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in call]
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert await stop == 0


async def test_duplicate_request_id_is_already_exists(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    first = stack.stub.Generate(gen("dup"))
    await asyncio.sleep(0.2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stack.stub.Generate(gen("dup"))]
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    reply = await stack.stub.Abort(pb.AbortRequest(request_id="dup"))
    assert reply.success
    responses = [r async for r in first]
    assert responses[-1].complete.finish_reason == "abort"


async def test_idle_time_before_a_request_is_not_a_stall(stack: Stack) -> None:
    """Silence while nothing was pending must not count once a request arrives."""
    stack.manager.last_receive -= 120  # two minutes idle
    stack.scheduler.mode = "silent"
    call = stack.stub.Generate(gen("fresh"))
    await asyncio.sleep(0.3)
    assert stack.manager.active == 1
    assert not stack.manager.stalled
    # Counting the idle time would read >= 120 s; the request's own wait is 0.3 s (a bound far
    # from both, so a busy machine cannot trip it).
    assert stack.manager.stalled_for() < 60
    call.cancel()


async def test_one_unreadable_output_fails_only_its_request(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    bad = stack.stub.Generate(gen("bad-output"))
    good = stack.stub.Generate(gen("good-output"))
    await asyncio.sleep(0.3)
    broken = token_output("bad-output", [5], 1, None)
    broken.output_token_logprobs_val = [["not a number"]]
    await stack.scheduler.send(broken)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in bad]
    assert err.value.code() == grpc.StatusCode.INTERNAL
    await stack.scheduler.send(token_output("good-output", [6], 1, {"type": "length"}))
    responses = [r async for r in good]
    assert responses[-1].complete.finish_reason == "length"
    assert stack.manager.failed is None
    assert not stack.srv.task.done(), "the server keeps serving"


async def test_health_follows_the_stall_probe_on_check_watch_and_healthcheck(stack: Stack) -> None:
    """Core's one health: the stall (the servicer's probe) reaches Watch without asking."""
    calls: list[Any] = []

    def stall() -> None:
        stack.scheduler.mode = "silent"
        calls.append(stack.stub.Generate(gen("stall")))

    def answer() -> None:
        stack.scheduler.mode = "echo"  # the deep probe's own request is answered again
        done = token_output("stall", [7], 1, {"type": "length", "length": 1})
        calls.append(asyncio.ensure_future(stack.scheduler.send(done)))

    await assert_health_follows_probe(
        stack.srv.channel, stack.stub, pb, service=SERVICE_NAME, fail=stall, recover=answer,
        reason="scheduler silent for",
    )  # fmt: skip


async def test_sigterm_path_is_not_serving_while_draining(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    held = stack.stub.Generate(gen("held"))
    await asyncio.sleep(0.2)
    await assert_not_serving_from_shutdown(
        stack.srv.channel, stack.stub, pb, service=SERVICE_NAME,
        start_shutdown=stack.srv.stop_event.set,
    )  # fmt: skip
    held.cancel()


async def test_max_tokens_zero_is_invalid_argument(stack: Stack) -> None:
    request = gen("zero")
    request.sampling_params.max_new_tokens = 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stack.stub.Generate(request)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "max_tokens must be at least 1, got 0"


async def _aborted_rids(stack: Stack, want: set[str], timeout_s: float = 5.0) -> set[str]:
    """The AbortReq rids the scheduler has received, waiting until ``want`` are among them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = {o.rid for o in stack.scheduler.received if isinstance(o, sg.AbortReq)}
        if want <= got or loop.time() > deadline:
            return got
        await asyncio.sleep(0.02)


async def _sent(stack: Stack, count: int) -> list[Any]:
    """Until the scheduler has received ``count`` generate requests (not the warm-up)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        reqs = [
            o
            for o in stack.scheduler.received
            if isinstance(o, sg.TokenizedGenerateReqInput) and not o.rid.startswith("WARMUP")
        ]
        if len(reqs) >= count:
            return reqs
        assert loop.time() < deadline, "the scheduler never got the request"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False])
async def test_client_cancel_while_waiting_aborts_in_the_scheduler(
    stack: Stack, stream: bool
) -> None:
    """A cancel that lands while the servicer waits for the scheduler's next output still tells
    the scheduler to drop the request (the stream's own cleanup used to forget it first)."""
    stack.scheduler.mode = "silent"
    call = stack.stub.Generate(gen(f"wait-{stream}", stream=stream))
    (req,) = await _sent(stack, 1)
    call.cancel()
    assert req.rid in await _aborted_rids(stack, {req.rid})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while len(stack.servicer.registry) or stack.manager.active:
        assert loop.time() < deadline, "the request was never released"
        await asyncio.sleep(0.02)


async def test_client_cancel_of_n2_aborts_every_member(stack: Stack) -> None:
    stack.scheduler.mode = "silent"
    request = gen("group")
    request.sampling_params.n = 2
    request.sampling_params.temperature = 1.0
    call = stack.stub.Generate(request)
    (prefix,) = await _sent(stack, 1)  # phase 1: the shared prefill, held by the scheduler
    call.cancel()
    assert prefix.rid in await _aborted_rids(stack, {prefix.rid})


@pytest.mark.parametrize("coalesce", [True, False])
async def test_outputs_waiting_are_taken_together_unless_coalescing_is_off(
    stack: Stack, coalesce: bool
) -> None:
    manager = stack.manager
    manager.coalesce = coalesce
    rid = f"coalesce-{coalesce}"
    manager.open([rid])
    try:
        for step in range(1, 4):  # three steps land before the stream reads (it is behind)
            finish = {"type": "length", "length": 3} if step == 3 else None
            await stack.scheduler.send(token_output(rid, [10 + step], step, finish))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while manager.waiting(rid) < 3:
            assert loop.time() < deadline, "the outputs never arrived"
            await asyncio.sleep(0.01)
        batches = [[o.token_ids for o in batch] async for batch in manager.stream(rid)]
    finally:
        await manager.release([rid])
        manager.coalesce = True
    ids = [[11], [12], [13]]
    assert batches == ([ids] if coalesce else [[i] for i in ids])


async def test_kv_events_under_faults() -> None:
    """The reliability suite's KV faults (the publisher killed and restarted, a silent replay,
    a gap) through this servicer: a scripted publisher on SGLang's wire stands in for the
    scheduler's (``test_kv_events.py`` relays the real one)."""
    async with ScriptedPublisher(style="sglang") as publisher:
        config = _Config()
        config.kv_events_config = json.dumps(
            {
                "publisher": "zmq",
                "endpoint": publisher.endpoint,
                "replay_endpoint": publisher.replay_endpoint,
            }
        )
        async with make_stack(config) as built:

            def open_stream(start: int) -> object:
                request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=start)
                return built.stub.SubscribeKvEvents(request)

            outcomes = await kv_fault_outcomes(open_stream, publisher)
    record("sglang", kv_outcomes=outcomes)
    assert outcomes == EXPECTED


async def _drive_constrained_end(stack: Stack, rid: str, finish: dict[str, Any]) -> tuple[
    list[pb.GenerateResponse], grpc.aio.AioRpcError, list[tuple[str, str]]
]:  # fmt: skip
    """A stream the scheduler answers with one token, then ``finish`` (what SGLang sends)."""
    stack.scheduler.mode = "silent"
    call = stack.stub.Generate(gen(rid))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not any(getattr(o, "rid", "") == rid for o in stack.scheduler.received):
        assert loop.time() < deadline, "the request never reached the scheduler"
        await asyncio.sleep(0.01)
    await stack.scheduler.send(token_output(rid, [11], 1, None))
    await stack.scheduler.send(token_output(rid, [0], 2, finish))
    received: list[pb.GenerateResponse] = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for response in call:
            received.append(response)
    trailers = [(str(k), str(v)) for k, v in (await call.trailing_metadata() or ())]
    return received, err.value, trailers


async def test_a_grammar_abort_the_engine_attributes_is_failed_precondition_with_trailer(
    stack: Stack,
) -> None:
    from smg_servicer_sglang import grammar_hooks

    # The finish exactly as the scheduler's hook leaves it (FINISH_ABORT's own wire form).
    finish = sg.FINISH_ABORT(grammar_hooks.DEAD_END_DETAIL, 400, grammar_hooks.ERR_TYPE).to_json()
    received, err, trailers = await _drive_constrained_end(stack, "constrained", finish)
    assert [list(r.chunk.token_ids) for r in received] == [[11]]  # the token before the end
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == (
        "the engine could not continue the request under its constraint: "
        + grammar_hooks.DEAD_END_DETAIL
    )
    assert ("smg-constraint-failed", "engine") in trailers
    assert len(stack.servicer.registry) == 0


async def test_an_unattributed_engine_abort_is_not_a_constraint_failure(stack: Stack) -> None:
    # SGLang's own words for a rejected token, without the hook's stamp: an engine fault.
    finish = sg.FINISH_ABORT(
        "Grammar accept_token failed: Tokens not accepted: 0", 500, "InternalServerError"
    ).to_json()
    _, err, trailers = await _drive_constrained_end(stack, "unattributed", finish)
    assert err.code() == grpc.StatusCode.INTERNAL
    assert all(key != "smg-constraint-failed" for key, _ in trailers)

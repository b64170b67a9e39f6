"""Servicer behaviour that needs engine states a real CPU engine does not reach on demand:
engine errors, refused cache flushes, health transitions (FakeAsyncLLM)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm.health_servicer import SERVICE_NAME, VllmHealthServicer
from smg_servicer_vllm.testing import FakeAsyncLLM

pytestmark = [pytest.mark.contract, pytest.mark.asyncio(loop_scope="session")]


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise AssertionError(f"unexpected abort {code}: {details}")


async def test_health_servicer_follows_the_engine_and_shutdown() -> None:
    engine = FakeAsyncLLM()
    health = VllmHealthServicer(engine)

    async def status(service: str = "") -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return (await health.Check(request, _Context())).status  # type: ignore[arg-type]

    assert await status() == health_pb2.HealthCheckResponse.SERVING
    assert await status(SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING
    engine.errored = True
    assert await status() == health_pb2.HealthCheckResponse.NOT_SERVING
    engine.errored = False
    assert await status() == health_pb2.HealthCheckResponse.SERVING
    health.set_not_serving()  # the launcher's shutdown: for good
    assert await status(SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_engine_health_check_reports_a_dead_engine(fake_stack: tuple[Any, Any]) -> None:
    servicer, stub = fake_stack
    servicer.engine.errored = True
    try:
        response = await stub.HealthCheck(pb.HealthCheckRequest())
        assert (response.healthy, response.message) == (False, "Engine is not alive")
    finally:
        servicer.engine.errored = False
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy


async def test_flush_cache_refusal_and_deadline(fake_stack: tuple[Any, Any]) -> None:
    servicer, stub = fake_stack
    servicer.engine.flush_succeeds = False
    try:
        once = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=0))
        assert (once.success, once.message) == (False, "refused; requests may be in flight")
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=0.3))
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=float("inf")))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        servicer.engine.flush_succeeds = True
    assert (await stub.FlushCache(common_pb2.FlushCacheRequest())).success


async def test_a_text_model_refuses_images_as_invalid_argument(fake_stack: tuple[Any, Any]) -> None:
    _, stub = fake_stack
    refs = pb.GenerateRequest(
        request_id="mm-refs",
        tokenized=pb.TokenizedInput(input_ids=[1]),
        media_refs=pb.MediaRefs(items=[pb.MediaRef(url="http://x")]),
    )
    tensors = pb.GenerateRequest(
        request_id="mm-tensors", tokenized=pb.TokenizedInput(input_ids=[1])
    )
    tensors.mm_inputs.im_token_id = 1
    for request in (refs, tensors):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Generate(request):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "this model accepts no multimodal input" in (info.value.details() or "")


@pytest.mark.contract
async def test_constructing_the_servicer_freezes_the_start_up_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM's launcher builds the servicer after AsyncLLM has started: the one moment we get to
    # take vLLM's start-up objects out of full garbage collections.
    from smg_servicer_vllm import servicer as servicer_module

    calls: list[int] = []
    monkeypatch.setattr(servicer_module, "freeze_startup_heap", lambda: calls.append(1) or 0)
    servicer_module.VllmEngineServicer(FakeAsyncLLM(), 0.0)
    assert calls == [1]


class _StreamContext(_Context):
    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False


async def test_a_closed_rpc_closes_generate_at_once() -> None:
    """vLLM 0.34 drains on SIGTERM until every cancelled RPC has closed ``generate()`` (which
    aborts the request): the servicer closes it as its own stream closes, wherever it was
    suspended, instead of leaving it to the garbage collector's finalizer."""
    import time

    from smg_grpc_servicer.vllm.servicer import VllmEngineServicer
    from smg_servicer_core.testing.requests import generate_request

    engine = FakeAsyncLLM(token_delay_s=0.01)
    servicer = VllmEngineServicer(engine, time.time())
    request = generate_request("vllm", [5, 6, 7], max_tokens=200, stream=True)
    responses: Any = servicer.Generate(request, _StreamContext())
    try:
        await responses.__anext__()  # suspended at its yield, generate() mid-stream
        assert request.request_id in engine.output_processor.running
        await responses.aclose()
        assert request.request_id not in engine.output_processor.running
    finally:
        if servicer.metrics_server is not None:
            servicer.metrics_server.close()


@pytest.mark.parametrize(
    ("config", "want"),
    [
        (None, ("", "")),  # a vLLM without the structured outputs config: not said
        ({"reasoning_parser": ""}, ("", "first_token")),
        ({"reasoning_parser": "deepseek_r1"}, ("deepseek_r1", "after_reasoning")),
        (
            {"reasoning_parser": "deepseek_r1", "enable_in_reasoning": True},
            ("deepseek_r1", "first_token"),
        ),
    ],
)
def test_reasoning_parser_and_grammar_start_come_from_the_engines_config(
    config: dict[str, Any] | None, want: tuple[str, str]
) -> None:
    from types import SimpleNamespace

    from smg_servicer_vllm import info

    engine = FakeAsyncLLM()
    if config is not None:
        engine.vllm_config.structured_outputs_config = SimpleNamespace(**config)
    got = info.server_info(engine, 0, 1.0)
    assert (got.engine_reasoning_parser, got.constrained_decoding_start) == want


async def test_an_engine_that_does_not_say_whether_it_is_paused_is_unavailable(
    fake_stack: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from smg_servicer_vllm import info

    servicer, stub = fake_stack
    monkeypatch.setattr(info, "PAUSE_PROBE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(servicer.engine, "pause_probe_delay_s", 1.0)
    with pytest.raises(grpc.aio.AioRpcError) as hung:
        await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert hung.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "whether it is paused" in (hung.value.details() or "")


async def test_last_receive_timestamp_is_the_engines_last_output(serve_llm: Any) -> None:
    """Unset (0) until the engine has given an output; then the wall time of the last one."""
    import time

    from smg_servicer_core.testing.requests import generate_request

    async with serve_llm(FakeAsyncLLM()) as (_, stub):
        assert (await stub.GetServerInfo(pb.GetServerInfoRequest())).last_receive_timestamp == 0
        before = time.time()
        async for _ in stub.Generate(generate_request("vllm", [1, 2, 3], max_tokens=3)):
            pass
        after = time.time()
        got = (await stub.GetServerInfo(pb.GetServerInfoRequest())).last_receive_timestamp
    assert before <= got <= after


@pytest.mark.parametrize(
    ("flag", "constraint", "passed"),
    [(True, {"regex": "[ab]+"}, True), (False, {"regex": "[ab]+"}, False), (True, {}, False)],
    ids=["shaped-constraint", "engine-start", "no-constraint"],
)
async def test_a_constraint_shaped_from_the_first_token_starts_there_in_vllm(
    serve_llm: Any, flag: bool, constraint: dict[str, str], passed: bool
) -> None:
    """``grammar_from_first_token`` on a constrained request: vLLM's ``reasoning_ended`` (the
    grammar runs from the first token whatever reasoning parser the engine has); without it, or
    without a constraint, vLLM decides where the grammar starts (nothing passed)."""
    from smg_servicer_core.testing.requests import generate_request

    engine = FakeAsyncLLM()
    seen: list[dict[str, Any]] = []
    request = generate_request("vllm", [1, 2], max_tokens=2)
    for field, value in constraint.items():
        setattr(request.sampling_params, field, value)
    generate = engine.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return generate(*args, **kwargs)

    engine.generate = spy  # type: ignore[method-assign]
    request.sampling_params.grammar_from_first_token = flag
    async with serve_llm(engine) as (_, stub):
        async for _ in stub.Generate(request):
            pass
    [kwargs] = seen
    assert ("reasoning_ended" in kwargs, kwargs.get("reasoning_ended")) == (
        (True, True) if passed else (False, None)
    )

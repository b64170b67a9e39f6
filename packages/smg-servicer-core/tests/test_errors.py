from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc

from smg_servicer_core import errors
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.server import EngineLifecycle, ServiceBinding
from smg_servicer_core.testing import FakeEngine, FakeScript, mlx_generate, running_server

EXPECTED = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.Unsupported: grpc.StatusCode.UNIMPLEMENTED,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _all_error_classes() -> set[type[errors.ServicerError]]:
    found: set[type[errors.ServicerError]] = set()
    todo: list[type[errors.ServicerError]] = [errors.ServicerError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__ == errors.__name__:
                found.add(sub)
                todo.append(sub)
    return found


@pytest.mark.unit
def test_every_error_class_is_covered() -> None:
    # ConstraintFailed prefixes its message and adds a trailer: its own test below.
    assert _all_error_classes() == set(EXPECTED) | {errors.ConstraintFailed}


class RaisingServicer(mlx_engine_pb2_grpc.MlxEngineServicer):
    """Raises whatever ``self.to_raise`` holds, unary or mid-stream."""

    to_raise: BaseException = RuntimeError("boom")

    @errors.grpc_errors
    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:
        raise self.to_raise

    @errors.grpc_errors
    async def Generate(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1]))
        raise self.to_raise


@pytest.fixture
async def raising() -> AsyncIterator[tuple[RaisingServicer, mlx_engine_pb2_grpc.MlxEngineStub]]:
    servicer = RaisingServicer()
    engine: EngineLifecycle = FakeEngine()
    binding = ServiceBinding(
        "mlx.grpc.engine.MlxEngine",
        lambda s: mlx_engine_pb2_grpc.add_MlxEngineServicer_to_server(servicer, s),
    )
    async with running_server([binding], HealthFrame("x"), engine) as server:
        yield servicer, mlx_engine_pb2_grpc.MlxEngineStub(server.channel)


@pytest.mark.contract
@pytest.mark.parametrize(
    ("cls", "code"), list(EXPECTED.items()), ids=lambda v: getattr(v, "__name__", str(v))
)
async def test_error_class_maps_to_its_code(raising, cls, code) -> None:
    servicer, stub = raising
    servicer.to_raise = cls("the client may read this")
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert unary.value.code() == code
    assert unary.value.details() == "the client may read this"
    call = stub.Generate(mlx_generate([1, 2], request_id="r-mid"))
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        async for _ in call:
            pass
    assert streamed.value.code() == code


def _trailers(metadata: Any) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in (metadata or ())]


@pytest.mark.contract
async def test_a_constraint_failure_is_failed_precondition_with_the_engine_trailer(
    raising,
) -> None:
    servicer, stub = raising
    servicer.to_raise = errors.ConstraintFailed("the grammar rejected token 7")
    want = (
        "the engine could not continue the request under its constraint: "
        "the grammar rejected token 7"
    )
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert unary.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert unary.value.details() == want
    assert ("smg-constraint-failed", "engine") in _trailers(unary.value.trailing_metadata())
    # Mid-stream: the tokens already sent arrive, then the status and the trailer.
    call = stub.Generate(mlx_generate([1, 2], request_id="r-constraint", stream=True))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        async for response in call:
            received.append(response)
    assert [list(r.chunk.token_ids) for r in received] == [[1]]
    assert streamed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert streamed.value.details() == want
    assert _trailers(await call.trailing_metadata()).count(("smg-constraint-failed", "engine")) == 1


@pytest.mark.contract
async def test_no_other_error_carries_the_constraint_trailer(raising) -> None:
    servicer, stub = raising
    servicer.to_raise = errors.FailedPrecondition("not configured")
    call = stub.Generate(mlx_generate([1, 2], request_id="r-plain"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert all(k != "smg-constraint-failed" for k, _ in _trailers(await call.trailing_metadata()))


@pytest.mark.contract
async def test_unexpected_exception_is_internal_without_its_text(raising, caplog) -> None:
    servicer, stub = raising
    servicer.to_raise = KeyError("/srv/secret/path token=abc123")
    caplog.set_level(logging.ERROR, logger="smg_servicer_core.errors")
    call = stub.Generate(mlx_generate([1, 2], request_id="req-42"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INTERNAL
    details = info.value.details() or ""
    assert "req-42" in details
    assert "secret" not in details and "abc123" not in details and "KeyError" not in details
    assert any(r.exc_info and "abc123" in str(r.exc_info[1]) for r in caplog.records), (
        "the traceback goes to the log"
    )


@pytest.mark.contract
async def test_engine_fault_mid_stream_never_leaks(stack) -> None:
    stack.engine.default_script = FakeScript(fail_after=3)
    chunks = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for response in stack.stub.Generate(mlx_generate([5, 6], stream=True, max_tokens=10)):
            chunks.append(response)
    # Every token made before the fault is delivered (in one chunk or several).
    assert sum(len(r.chunk.token_ids) for r in chunks) == 3
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (info.value.details() or "")
    assert len(stack.servicer.registry) == 0


@pytest.mark.unit
def test_long_messages_are_cut() -> None:
    code, detail = errors.status_for(errors.InvalidRequest("x" * 5000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(detail) == errors.MAX_DETAIL_CHARS


@pytest.mark.unit
@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (404, grpc.StatusCode.NOT_FOUND),
        (408, grpc.StatusCode.DEADLINE_EXCEEDED),
        (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (503, grpc.StatusCode.UNAVAILABLE),
        (504, grpc.StatusCode.DEADLINE_EXCEEDED),
        (500, grpc.StatusCode.INTERNAL),
        ("teapot", grpc.StatusCode.INTERNAL),
    ],
)
def test_http_status_table(status, code) -> None:
    assert errors.from_http_status(status, "m").code == code


@pytest.mark.unit
def test_a_relayed_message_loses_native_log_prefixes() -> None:
    # SGLang relays xgrammar's exception text for a schema it cannot compile.
    relayed = (
        "Failed to compile json grammar: [11:06:22] /project/cpp/json_schema_converter.cc:4175: "
        "minLength 5 is greater than maxLength 1"
    )
    error = errors.from_http_status(400, relayed)
    assert error.message == (
        "Failed to compile json grammar: minLength 5 is greater than maxLength 1"
    )
    assert errors.from_http_status(400, "top_k must be < 128 [a:b] x.cc").message == (
        "top_k must be < 128 [a:b] x.cc"  # only the native prefix's exact shape goes
    )


@pytest.mark.contract
async def test_a_huge_request_id_is_cut_in_the_message_and_the_log(raising, caplog) -> None:
    servicer, stub = raising
    servicer.to_raise = KeyError("boom")
    caplog.set_level(logging.ERROR, logger="smg_servicer_core.errors")
    rid = "r" * 100_000
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.Generate(mlx_generate([1, 2], request_id=rid)):
            pass
    assert len(info.value.details() or "") < 300
    assert all(len(r.getMessage()) < 400 for r in caplog.records)


@pytest.mark.unit
def test_grpc_s_traceback_for_a_client_gone_mid_send_is_one_debug_line(caplog) -> None:
    """grpc.aio logs ``ExecuteBatchError`` with a traceback at ERROR when a stream's status or
    message cannot be sent because its client went away (a cancel racing the stream's end): the
    servicer's filter turns it into one DEBUG line; grpc's other records pass untouched."""
    errors.quiet_gone_clients()
    errors.quiet_gone_clients()  # idempotent
    grpc_logger = logging.getLogger("grpc._cython.cygrpc")
    assert len([f for f in grpc_logger.filters if type(f).__name__ == "_ClientGone"]) == 1
    caplog.set_level(logging.DEBUG)
    try:
        raise RuntimeError('Failed "execute_batch": (SendStatusFromServerOperation,)')
    except RuntimeError:
        grpc_logger.exception(
            "ExecuteBatchError raised in core by servicer method [%s]", "/x.Engine/Generate"
        )
        grpc_logger.exception("Unexpected [%s] raised by servicer method [%s]", "E", "/x/Y")
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert (
        "smg_servicer_core.errors",
        logging.DEBUG,
        "the client of /x.Engine/Generate went away before its stream's end could be sent",
    ) in records
    assert not [r for r in records if "ExecuteBatchError" in r[2]]
    assert (
        "grpc._cython.cygrpc",
        logging.ERROR,
        "Unexpected [E] raised by servicer method [/x/Y]",
    ) in records


class _Recorder:
    """A metrics observer that records what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def call(self, rpc: str) -> _Recorder:
        return self

    def message(self, item: Any) -> None:
        self.events.append("message")

    def done(self, code: str) -> None:
        self.events.append(f"done {code}")


class _AbortingContext:
    """What ``grpc.aio`` does on ``abort``: the status goes out, then AbortError is raised."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.recorder.events.append(f"status {code.name}")
        raise grpc.aio.AbortError()

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INTERNAL


@pytest.mark.unit
async def test_a_failed_call_is_counted_before_its_status_goes_out() -> None:
    """``context.abort`` sends the status before it raises: the call's outcome must be in the
    metrics by then, once, or a client reading ``/metrics`` on seeing the status misses it."""
    servicer = RaisingServicer()
    servicer.to_raise = errors.Aborted("stopped by an Abort RPC")
    recorder = _Recorder()
    servicer.metrics = recorder  # type: ignore[attr-defined]
    context = _AbortingContext(recorder)
    with pytest.raises(grpc.aio.AbortError):
        async for _ in servicer.Generate(mlx_generate([1, 2]), context):
            pass
    assert recorder.events == ["message", "done ABORTED", "status ABORTED"]
    recorder.events.clear()
    with pytest.raises(grpc.aio.AbortError):
        await servicer.GetServerInfo(pb.GetServerInfoRequest(), context)
    assert recorder.events == ["done ABORTED", "status ABORTED"]

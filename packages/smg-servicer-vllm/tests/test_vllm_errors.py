"""vLLM's exception table, entry by entry with vLLM's own classes, and where each applies.

The installed vLLM's classes: a class the release lacks (``GenerationError`` and
``RetryableRequestError`` before 0.32, ``GracefulHTTPError`` in ``vllm.exceptions`` before 0.29)
has no case there (nothing of it can be raised); the table matches by name, so nothing else
differs."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import grpc
import pytest
import vllm.exceptions
from vllm.exceptions import (
    VLLMClientError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from smg_servicer_core.errors import ServicerError, status_for
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm.errors import translate, translated


class _Missing(Exception):
    """Stands for a class the installed vLLM lacks; its cases are left out of CASES."""


def _vllm(name: str) -> type[Exception]:
    return getattr(vllm.exceptions, name, _Missing)


GracefulHTTPError: Any = _vllm("GracefulHTTPError")  # 0.29+
GenerationError: Any = _vllm("GenerationError")  # 0.32+
RetryableRequestError: Any = _vllm("RetryableRequestError")  # 0.32+


def _wrapped(cause: BaseException) -> EngineGenerateError:
    outer = EngineGenerateError()
    outer.__cause__ = cause
    return outer


def _graceful(message: str, status: HTTPStatus) -> BaseException:
    return GracefulHTTPError(message, status) if GracefulHTTPError is not _Missing else _Missing()


CASES: list[tuple[BaseException, grpc.StatusCode, grpc.StatusCode]] = [
    # (exception, status while the request is built, status once it streams)
    (EngineDeadError(), grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (_graceful("busy", HTTPStatus.TOO_MANY_REQUESTS),
     grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (_graceful("gone", HTTPStatus.SERVICE_UNAVAILABLE),
     grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (VLLMNotFoundError("no adapter x"), grpc.StatusCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
    (VLLMValidationError("prompt too long"),
     grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT),
    (VLLMClientError("bad"), grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT),
    (VLLMUnprocessableEntityError("bad entity"),  # a subclass: matched along the MRO
     grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT),
    (ValueError("bad top_k"), grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL),
    (TypeError("bad type"), grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL),
    (_wrapped(ValueError("inner")), grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL),
    (_wrapped(EngineDeadError()), grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (RuntimeError("kaboom"), grpc.StatusCode.INTERNAL, grpc.StatusCode.INTERNAL),
    # 0.33+: a paused engine refuses on arrival with these (RequestError.to_exception())
    (RetryableRequestError(), grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (GenerationError(), grpc.StatusCode.INTERNAL, grpc.StatusCode.INTERNAL),
]  # fmt: skip
CASES = [case for case in CASES if not isinstance(case[0], _Missing)]


@pytest.mark.unit
@pytest.mark.parametrize(("exc", "building", "streaming"), CASES)
def test_every_table_entry(
    exc: BaseException, building: grpc.StatusCode, streaming: grpc.StatusCode
) -> None:
    assert status_for(translate(exc, building_request=True))[0] == building
    assert status_for(translate(exc, building_request=False))[0] == streaming


@pytest.mark.unit
def test_the_context_manager_chains_the_cause_and_lets_cancellation_through() -> None:
    with pytest.raises(ServicerError, match="n must be positive") as caught, translated():
        raise ValueError("n must be positive")
    assert caught.value.__cause__ is not None
    assert status_for(caught.value)[0] == grpc.StatusCode.INVALID_ARGUMENT
    stage = translated()
    stage.building_request = False
    with pytest.raises(ValueError, match="late"), stage:
        raise ValueError("late")


@pytest.mark.contract
@pytest.mark.asyncio(loop_scope="session")
async def test_a_value_error_mid_stream_is_internal_without_its_text(
    serve_llm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from smg_servicer_vllm.testing import FakeAsyncLLM

    # 20 ms a step: the stream takes each output before the next (the fake, like vLLM's
    # collector, lets an error replace an output nobody has taken yet).
    llm = FakeAsyncLLM(token_delay_s=0.02)
    async with serve_llm(llm) as (_, stub):
        request = pb.GenerateRequest(
            request_id="mid-stream",
            tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=pb.SamplingParams(max_tokens=8),
            stream=True,
        )
        llm.raise_after = (2, ValueError("secret detail 42"))
        caplog.set_level(logging.ERROR, logger="smg_servicer_core.errors")
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as late:
            async for message in stub.Generate(request):
                received.append(message)
        assert sum(len(m.chunk.token_ids) for m in received) == 2
        assert late.value.code() == grpc.StatusCode.INTERNAL
        assert late.value.details() == "internal error (request mid-stream); see the server log"
        assert any(r.exc_info and "secret detail 42" in str(r.exc_info[1]) for r in caplog.records)
        # the same error before vLLM accepted the request is the client's
        request.request_id = "at-start"
        llm.raise_after = (0, ValueError("max_tokens too large for this model"))
        with pytest.raises(grpc.aio.AioRpcError) as early:
            async for _ in stub.Generate(request):
                pass
        assert early.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert early.value.details() == "max_tokens too large for this model"

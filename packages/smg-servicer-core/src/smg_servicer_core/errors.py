"""Errors that carry their gRPC status, and the one place that turns them into ``context.abort``.

The tree::

    ServicerError                  INTERNAL            (base; never raised bare)
    ├── InvalidRequest             INVALID_ARGUMENT    client mistake: bad ids, bad sampling values
    ├── NotFound                   NOT_FOUND           unknown adapter, unknown LoRA, ...
    ├── AlreadyExists              ALREADY_EXISTS      a request id that is already in flight
    ├── PermissionDenied           PERMISSION_DENIED   outside what the operator allows (a path
    │                                                  outside the allowed folders)
    ├── FailedPrecondition         FAILED_PRECONDITION server not configured for this call
    │   └── ConstraintFailed       FAILED_PRECONDITION the engine could not continue under the
    │                                                  request's grammar/schema (its own word);
    │                                                  trailer ``smg-constraint-failed: engine``
    ├── OutOfRange                 OUT_OF_RANGE        a cursor the server cannot resume
    ├── Unsupported                UNIMPLEMENTED       a feature this engine does not have
    ├── Overloaded                 RESOURCE_EXHAUSTED  admission queue full (the router retries)
    ├── Unavailable                UNAVAILABLE         not ready / shutting down / engine dead
    ├── Aborted                    ABORTED             request stopped by an Abort RPC
    ├── DeadlineExceeded           DEADLINE_EXCEEDED   an engine operation ran past its bound
    └── DataLoss                   DATA_LOSS           a stream that lost history mid-way

    ConfigError                    (not a gRPC error)  bad flag or variable: exit 2, one line

The router retries UNKNOWN, UNAVAILABLE, RESOURCE_EXHAUSTED, DATA_LOSS, CANCELLED and
DEADLINE_EXCEEDED, and opens its circuit breaker on repeated INTERNAL. So client mistakes must be
INVALID_ARGUMENT (never INTERNAL) and no exception may escape a handler (grpc.aio would report it as
UNKNOWN, which is retried five times).

An error's ``trailers`` (empty for all but :class:`ConstraintFailed`) go out as the call's
trailing metadata with its status (``set_trailing_metadata`` before ``abort``).

Anything that is not a :class:`ServicerError` is unexpected: the client gets INTERNAL with a short
generic message naming the request id, and the traceback goes to the log only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, NoReturn, Protocol, TypeVar, cast

import grpc
import grpc.aio

from smg_servicer_core.wire_guard import MalformedRequest

logger = logging.getLogger(__name__)

# Messages longer than this are cut before they reach the client.
MAX_DETAIL_CHARS = 512


class ServicerError(Exception):
    """Base class: an error whose message is safe to show the client."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    #: Client-fault errors log at INFO without a traceback; server faults at ERROR.
    client_fault: ClassVar[bool] = False
    #: Trailing metadata sent with the status (key, value pairs).
    trailers: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(ServicerError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    client_fault = True


class NotFound(ServicerError):
    code = grpc.StatusCode.NOT_FOUND
    client_fault = True


class AlreadyExists(ServicerError):
    code = grpc.StatusCode.ALREADY_EXISTS
    client_fault = True


class PermissionDenied(ServicerError):
    """The caller asked for something the operator's settings do not allow (a path outside the
    allowed folders)."""

    code = grpc.StatusCode.PERMISSION_DENIED
    client_fault = True


class FailedPrecondition(ServicerError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    client_fault = True


#: The trailer that marks a constraint failure the engine itself attributed (spec §3.12).
CONSTRAINT_FAILED_TRAILER = ("smg-constraint-failed", "engine")


class ConstraintFailed(FailedPrecondition):
    """The engine could not continue a request under its constraint (a grammar, regex or JSON
    schema) and said so itself: raised only on the engine's own attribution (SGLang: a finish the
    scheduler hook stamped ``GrammarRejectedToken``), never guessed from an error's text. The
    router answers FAILED_PRECONDITION with 400."""

    PREFIX: ClassVar[str] = "the engine could not continue the request under its constraint: "
    trailers = (CONSTRAINT_FAILED_TRAILER,)

    def __init__(self, detail: str) -> None:
        super().__init__(self.PREFIX + detail)


class OutOfRange(ServicerError):
    code = grpc.StatusCode.OUT_OF_RANGE
    client_fault = True


class Unsupported(ServicerError):
    code = grpc.StatusCode.UNIMPLEMENTED
    client_fault = True


class Overloaded(ServicerError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServicerError):
    code = grpc.StatusCode.UNAVAILABLE


class Aborted(ServicerError):
    code = grpc.StatusCode.ABORTED
    client_fault = True


class DataLoss(ServicerError):
    code = grpc.StatusCode.DATA_LOSS


class ConfigError(Exception):
    """A bad flag, variable or file at start-up. The entry point prints one line and exits 2."""


class DeadlineExceeded(ServicerError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_HTTP_STATUS: dict[int, type[ServicerError]] = {
    400: InvalidRequest,
    404: NotFound,
    408: DeadlineExceeded,
    409: Aborted,
    429: Overloaded,
    503: Unavailable,
    504: DeadlineExceeded,
}


#: A native library's log prefix inside an engine's message: ``[11:06:22] /project/cpp/x.cc:4175: ``
#: (xgrammar's, relayed by SGLang). A timestamp and a build path tell the client nothing.
_NATIVE_PREFIX = re.compile(r"\[\d{2}:\d{2}:\d{2}\] \S+?\.(?:cc|cpp|cxx|c|h|hpp|cu):\d+: ")


def from_http_status(status: object, message: str) -> ServicerError:
    """The error for an engine's HTTP-style status: 400->INVALID_ARGUMENT, 404->NOT_FOUND,
    408/504->DEADLINE_EXCEEDED, 409->ABORTED, 429->RESOURCE_EXHAUSTED, 503->UNAVAILABLE, anything
    else (500 included, or not a number) -> INTERNAL. The engine's message is relayed without
    native log prefixes (timestamp, source file and line)."""
    try:
        code = int(status)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        code = 500
    return _BY_HTTP_STATUS.get(code, ServicerError)(_NATIVE_PREFIX.sub("", message))


class _AbortContext(Protocol):
    def set_trailing_metadata(self, trailing_metadata: tuple[tuple[str, str], ...]) -> None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...


def status_for(exc: BaseException, request_id: str = "") -> tuple[grpc.StatusCode, str]:
    """The status and client-safe message for ``exc``. Pure; logs nothing."""
    if isinstance(exc, ServicerError):
        detail = exc.message
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[: MAX_DETAIL_CHARS - 3] + "..."
        return exc.code, detail
    suffix = f" (request {request_id})" if request_id else ""
    return grpc.StatusCode.INTERNAL, f"internal error{suffix}; see the server log"


async def abort_from(
    context: _AbortContext, exc: BaseException, *, rpc: str, request_id: str = ""
) -> NoReturn:
    """Log ``exc`` appropriately and abort the call with its status (and its ``trailers``, if
    any). Never returns."""
    code, detail = status_for(exc, request_id)
    if isinstance(exc, ServicerError):
        level = logging.INFO if exc.client_fault else logging.ERROR
        logger.log(level, "%s %s -> %s: %s", rpc, request_id or "-", code.name, exc.message)
    else:
        logger.error(
            "%s %s -> INTERNAL: unexpected %s",
            rpc,
            request_id or "-",
            type(exc).__name__,
            exc_info=exc,
        )
    if isinstance(exc, ServicerError) and exc.trailers:
        context.set_trailing_metadata(exc.trailers)
    await context.abort(code, detail)


#: A request id is cut to this many characters in log lines and messages.
MAX_LOGGED_ID_CHARS = 128


def _request_id_of(request: object) -> str:
    rid = getattr(request, "request_id", "")
    if not isinstance(rid, str):
        return ""
    return rid if len(rid) <= MAX_LOGGED_ID_CHARS else rid[: MAX_LOGGED_ID_CHARS - 3] + "..."


_F = TypeVar("_F", bound=Callable[..., Any])


class _Observer(Protocol):
    """What :func:`grpc_errors` reports to when the servicer has ``metrics`` (see
    :mod:`smg_servicer_core.metrics`): ``call(rpc)`` returns an object with ``message(item)`` and
    ``done(code_name)``."""

    def call(self, rpc: str) -> Any: ...


def _code_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    code: object = context.code()  # set by context.abort (None if nothing set it)
    return str(getattr(code, "name", "UNKNOWN"))


def grpc_errors(method: _F) -> _F:
    """Decorate a servicer method (coroutine or async generator) so errors become statuses.

    A request that did not parse (a :class:`~smg_servicer_core.wire_guard.MalformedRequest` from
    :func:`~smg_servicer_core.wire_guard.tolerant_add`'s deserializer) is refused with
    INVALID_ARGUMENT before the method runs. ``grpc.aio`` abort errors and cancellation pass
    through untouched. When the servicer has a ``metrics`` observer (not None), every call
    reports its messages and final status code to it, an error's before its status is sent
    (``context.abort`` sends it at once, so a client that sees the status and then reads
    ``/metrics`` finds the call counted); without one the wrapper adds nothing to the call.
    """
    if inspect.isasyncgenfunction(method):
        return cast(_F, _stream_wrapper(cast(Callable[..., AsyncGenerator[Any, None]], method)))
    return cast(_F, _unary_wrapper(cast(Callable[..., Awaitable[Any]], method)))


_Ctx = grpc.aio.ServicerContext[Any, Any]


def _first_only(report: Callable[[str], None]) -> Callable[[str], None]:
    """``report``, run by the first call only (a call's outcome is counted once)."""
    pending = [report]

    def once(code: str) -> None:
        if pending:
            pending.pop()(code)

    return once


def _ignore(code: str) -> None:
    """No observer: nothing to report."""


#: The RPCs that get a request span when tracing is on (:mod:`smg_servicer_core.tracing`).
_TRACED = frozenset({"Generate"})


class _Both:
    """The metrics' call and the trace's span of one stream, told the same things."""

    __slots__ = ("done", "message")

    def __init__(self, first: Any, second: Any) -> None:
        def message(item: Any) -> None:
            first.message(item)
            second.message(item)

        def done(code: str) -> None:
            first.done(code)
            second.done(code)

        self.message = message
        self.done = done


def _recorder(self: object, name: str, request: object, context: _Ctx) -> Any:
    """What a stream reports to: the metrics' call (when the servicer has metrics), the request's
    span (when tracing is on and the caller sent trace context), both, or None (nothing)."""
    observer: _Observer | None = getattr(self, "metrics", None)
    call = observer.call(name) if observer is not None else None
    tracing: Any = getattr(self, "tracing", None)
    if tracing is None or name not in _TRACED:
        return call
    span = tracing.start(request, context.invocation_metadata())
    if span is None:
        return call
    return span if call is None else _Both(call, span)


def _stream_wrapper(
    method: Callable[..., AsyncGenerator[Any, None]],
) -> Callable[..., AsyncIterator[Any]]:
    name = method.__name__

    @functools.wraps(method)
    async def stream_wrapper(self: object, request: object, context: _Ctx) -> AsyncIterator[Any]:
        call = _recorder(self, name, request, context)
        if call is None:
            try:
                if type(request) is MalformedRequest:
                    raise InvalidRequest(request.message)
                async with contextlib.aclosing(method(self, request, context)) as items:
                    async for item in items:
                        yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort_from(context, exc, rpc=name, request_id=_request_id_of(request))
            return
        message = call.message
        done = _first_only(call.done)
        code = "OK"
        try:
            if type(request) is MalformedRequest:
                raise InvalidRequest(request.message)
            # aclosing: when the RPC's stream is closed (a cancel), the method's stream closes at
            # once, and with it the engine's, wherever they were suspended.
            async with contextlib.aclosing(method(self, request, context)) as items:
                async for item in items:
                    message(item)
                    yield item
        except grpc.aio.AbortError:
            code = _code_name(context)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            code = "CANCELLED"
            raise
        except Exception as exc:
            # Counted before the status goes out: ``context.abort`` sends it at once, and a
            # client that reads ``/metrics`` on seeing it must find this call counted.
            done(status_for(exc)[0].name)
            await abort_from(context, exc, rpc=name, request_id=_request_id_of(request))
        finally:
            done(code)

    return stream_wrapper


def _unary_wrapper(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    name = method.__name__

    @functools.wraps(method)
    async def unary_wrapper(self: object, request: object, context: _Ctx) -> Any:
        observer: _Observer | None = getattr(self, "metrics", None)
        done = _first_only(observer.call(name).done) if observer is not None else _ignore
        code = "OK"
        try:
            if type(request) is MalformedRequest:
                raise InvalidRequest(request.message)
            return await method(self, request, context)
        except grpc.aio.AbortError:
            code = _code_name(context)
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as exc:
            done(status_for(exc)[0].name)  # counted before ``context.abort`` sends the status
            await abort_from(context, exc, rpc=name, request_id=_request_id_of(request))
        finally:
            done(code)

    return unary_wrapper


#: What grpc.aio logs, with a traceback at ERROR, when the core cannot send a stream's next
#: message or its status (``ExecuteBatchError``): the client went away between the handler's last
#: step and the send (a cancel racing the stream's end, a closed connection).
_BATCH_FAILED = "ExecuteBatchError raised in core by servicer method"


class _ClientGone(logging.Filter):
    """Turns grpc.aio's ``ExecuteBatchError`` traceback into one DEBUG line of ours: the call is
    already dead in the core, nothing more can reach that client, and the servicer did nothing
    wrong (its handler ended or was cancelled as usual). Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith(_BATCH_FAILED):
            return True
        method = text.removeprefix(_BATCH_FAILED).strip(" []") or "?"
        logger.debug("the client of %s went away before its stream's end could be sent", method)
        return False


_CLIENT_GONE = _ClientGone()


def quiet_gone_clients() -> None:
    """Install :class:`_ClientGone` on grpc.aio's server logger (idempotent)."""
    grpc_logger = logging.getLogger("grpc._cython.cygrpc")
    if _CLIENT_GONE not in grpc_logger.filters:
        grpc_logger.addFilter(_CLIENT_GONE)

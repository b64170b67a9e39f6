"""vLLM exceptions -> servicer errors, by one table. No vLLM import: classes match by name along
the exception's MRO, so the most specific entry wins.

- ``EngineGenerateError`` is unwrapped to its cause first (it wraps what really went wrong);
- ``EngineDeadError`` -> UNAVAILABLE (the router retries on another worker);
- ``RetryableRequestError`` (0.32+; from 0.33 raised by ``generate()`` when a paused engine
  refuses the request) -> UNAVAILABLE, which the router retries on another worker; its parent
  ``GenerationError`` is a server fault and stays INTERNAL (generic message);
- ``GracefulHTTPError`` (queue overflow, busy profiler, ...) -> its HTTP status through core's
  table;
- ``VLLMNotFoundError`` (unknown LoRA, ...) -> NOT_FOUND;
- ``VLLMValidationError``, ``VLLMClientError`` -> INVALID_ARGUMENT, wherever they are raised;
- ``ValueError``, ``TypeError`` -> INVALID_ARGUMENT **only while the request is being built**
  (our ``SamplingParams`` construction, and vLLM's own checks before it accepts the request:
  :attr:`Translated.building_request`). Raised later, in the output stream, they are a server
  fault and stay unmapped;
- anything else is left alone: core turns it into INTERNAL with a generic message and the
  request id, the traceback in the log.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from smg_servicer_core.errors import (
    InvalidRequest,
    NotFound,
    ServicerError,
    Unavailable,
    from_http_status,
)

_Make = Callable[[BaseException], ServicerError]

_TABLE: dict[str, _Make] = {
    "EngineDeadError": lambda e: Unavailable("the engine is not running; retry elsewhere"),
    "RetryableRequestError": lambda e: Unavailable(
        "the engine did not take the request (paused); retry elsewhere"
    ),
    "GracefulHTTPError": lambda e: from_http_status(
        getattr(e, "http_status", 500), str(getattr(e, "message", "") or e)
    ),
    "VLLMNotFoundError": lambda e: NotFound(str(e)),
    "VLLMValidationError": lambda e: InvalidRequest(str(e)),
    "VLLMClientError": lambda e: InvalidRequest(str(e)),
}
#: Only while the request is being built: afterwards these are bugs, not client mistakes.
_REQUEST_TABLE: dict[str, _Make] = {
    "ValueError": lambda e: InvalidRequest(str(e)),
    "TypeError": lambda e: InvalidRequest(f"invalid request: {e}"),
}


def translate(exc: BaseException, *, building_request: bool = True) -> BaseException:
    """The servicer error for ``exc`` (or ``exc`` itself when nothing in the table matches)."""
    if isinstance(exc, ServicerError):
        return exc
    if type(exc).__name__ == "EngineGenerateError" and exc.__cause__ is not None:
        exc = exc.__cause__
    for cls in type(exc).__mro__:
        make = _TABLE.get(cls.__name__)
        if make is None and building_request:
            make = _REQUEST_TABLE.get(cls.__name__)
        if make is not None:
            return make(exc)
    return exc


class Translated:
    """``with translated() as stage:`` re-raises engine exceptions as servicer errors (the
    original chained as the cause). Set ``stage.building_request = False`` once the engine has
    accepted the request."""

    def __init__(self, building_request: bool = True) -> None:
        self.building_request = building_request

    def __enter__(self) -> Translated:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not isinstance(exc, Exception) or isinstance(exc, ServicerError):
            return  # nothing raised, a servicer error, or cancellation / GeneratorExit
        mapped = translate(exc, building_request=self.building_request)
        if mapped is not exc:
            raise mapped from exc


def translated(*, building_request: bool = True) -> Translated:
    return Translated(building_request)

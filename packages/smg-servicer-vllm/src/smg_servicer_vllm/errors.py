"""vLLM exceptions -> servicer errors, by one table. No vLLM import: classes match by name along
the exception's MRO, so the most specific entry wins.

- ``EngineGenerateError`` is unwrapped to its cause first (it wraps what really went wrong);
- ``EngineDeadError`` -> UNAVAILABLE (the router retries on another worker);
- ``GracefulHTTPError`` (queue overflow, busy profiler, ...) -> its HTTP status through core's
  table;
- ``VLLMNotFoundError`` (unknown LoRA, ...) -> NOT_FOUND;
- ``VLLMValidationError``, ``VLLMClientError``, ``ValueError``, ``TypeError`` -> INVALID_ARGUMENT;
- anything else is left alone: core turns it into INTERNAL with a generic message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from contextlib import contextmanager

from smg_servicer_core.errors import (
    InvalidRequest,
    NotFound,
    ServicerError,
    Unavailable,
    from_http_status,
)

_TABLE: dict[str, Callable[[BaseException], ServicerError]] = {
    "EngineDeadError": lambda e: Unavailable("the engine is not running; retry elsewhere"),
    "GracefulHTTPError": lambda e: from_http_status(
        getattr(e, "http_status", 500), str(getattr(e, "message", "") or e)
    ),
    "VLLMNotFoundError": lambda e: NotFound(str(e)),
    "VLLMValidationError": lambda e: InvalidRequest(str(e)),
    "VLLMClientError": lambda e: InvalidRequest(str(e)),
    "ValueError": lambda e: InvalidRequest(str(e)),
    "TypeError": lambda e: InvalidRequest(f"invalid request: {e}"),
}


def translate(exc: BaseException) -> BaseException:
    """The servicer error for ``exc`` (or ``exc`` itself when nothing in the table matches)."""
    if isinstance(exc, ServicerError):
        return exc
    if type(exc).__name__ == "EngineGenerateError" and exc.__cause__ is not None:
        exc = exc.__cause__
    for cls in type(exc).__mro__:
        make = _TABLE.get(cls.__name__)
        if make is not None:
            return make(exc)
    return exc


@contextmanager
def translated() -> Generator[None]:
    """Re-raise engine exceptions as servicer errors (the original chained as the cause)."""
    try:
        yield
    except (ServicerError, asyncio.CancelledError):
        raise
    except Exception as exc:
        mapped = translate(exc)
        if mapped is exc:
            raise
        raise mapped from exc

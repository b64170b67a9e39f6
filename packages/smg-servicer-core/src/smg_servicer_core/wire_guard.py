"""Bytes that are not the request message: INVALID_ARGUMENT with a plain message, never grpcio's
UNKNOWN with the parser's exception text.

grpcio parses each request with the handler's ``request_deserializer`` before any servicer code
runs; when that raises, ``grpc.aio`` ends the call with UNKNOWN and
``"Unexpected <class 'DecodeError'>: ..."`` (library internals, sent to the client). The
reliability suite's malformed-bytes fuzz found it on every engine.

:func:`tolerant_add` wraps a generated ``add_<Service>Servicer_to_server``: it registers the same
handlers with a deserializer that returns a :class:`MalformedRequest` instead of raising; the
servicer's ``grpc_errors`` wrapper (:mod:`smg_servicer_core.errors`) answers that with
INVALID_ARGUMENT ``the request is not a valid <Message> message``. One ``type(...) is`` check per
call; nothing per streamed message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import grpc

AddToServer = Callable[[Any, Any], None]


class MalformedRequest:
    """What a tolerant deserializer returns for bytes that do not parse."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _message_name(deserialize: Callable[[bytes], Any]) -> str:
    owner = getattr(deserialize, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "name", "request"))


def tolerant_deserializer(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    refusal = f"the request is not a valid {_message_name(deserialize)} message"

    @functools.wraps(deserialize)
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:  # protobuf's DecodeError, or anything a custom parser raises
            return MalformedRequest(refusal)

    return parse


def tolerant_handler(handler: Any) -> Any:
    """``handler`` (a ``grpc.RpcMethodHandler``) with a tolerant request deserializer."""
    deserialize = getattr(handler, "request_deserializer", None)
    if deserialize is None or not hasattr(handler, "_replace"):
        return handler
    return handler._replace(request_deserializer=tolerant_deserializer(deserialize))


class _TolerantGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self.inner = inner
        self.cache: dict[str, Any] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method: str = handler_call_details.method  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]
        if method not in self.cache:
            found = self.inner.service(handler_call_details)
            if found is None:
                return None
            self.cache[method] = tolerant_handler(found)
        return self.cache[method]


class _Capture:
    """Stands in for the server while a generated ``add_*_to_server`` runs."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.server.add_generic_rpc_handlers(tuple(_TolerantGeneric(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.server.add_registered_method_handlers(
            service, {name: tolerant_handler(h) for name, h in handlers.items()}
        )


_MARK = "_smg_tolerant"


def tolerant_add(add_to_server: AddToServer) -> AddToServer:
    """The generated ``add_to_server`` with every handler's deserializer made tolerant."""
    if getattr(add_to_server, _MARK, False):
        return add_to_server

    @functools.wraps(add_to_server)
    def add(servicer: Any, server: Any) -> None:
        add_to_server(servicer, _Capture(server))

    setattr(add, _MARK, True)
    return add

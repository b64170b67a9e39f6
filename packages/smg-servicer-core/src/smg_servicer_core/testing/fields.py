"""Every field of an info answer (``GetServerInfoResponse``, ``GetModelInfoResponse``) against what
the engine itself says (issue #40: a field comes from the engine or is left unset, never a
constant).

An engine's test states, for every field of the wire's message, what the engine says it is (read
from the engine's own objects, or a predicate where only a bound is knowable, such as an
uptime), or :data:`UNSET`. :func:`mismatches` walks the message's descriptor, so a field the wire
gains later and nobody accounted for is a mismatch too. Run on two engines started different
ways, a hard-coded field cannot follow both."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: The field holds its default (proto3: 0, "", false, empty; a message field is absent).
UNSET: Any = _Unset()


@dataclass(frozen=True)
class Satisfies:
    """A field that only a bound can describe (an uptime, a wall-clock time, a budget)."""

    check: Callable[[Any], bool]
    what: str

    def __repr__(self) -> str:
        return self.what


def value(message: Message, name: str) -> Any:
    """A field as plain Python: a list for a repeated field, a dict for a Struct, seconds for a
    Timestamp."""
    field: Any = message.DESCRIPTOR.fields_by_name[name]
    raw = getattr(message, name)
    if _repeated(field):
        return list(raw)
    if field.message_type is not None:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return raw.seconds
        return json_format.MessageToDict(raw)
    return raw


def _repeated(field: Any) -> bool:
    # protobuf 5+: is_repeated; older releases: the label
    repeated = getattr(field, "is_repeated", None)
    return bool(repeated) if repeated is not None else bool(field.label == field.LABEL_REPEATED)


def _is_default(message: Message, field: Any) -> bool:
    if _repeated(field):
        return not list(getattr(message, field.name))
    if field.message_type is not None:
        return not message.HasField(field.name)
    return getattr(message, field.name) == field.default_value


def mismatches(message: Message, expected: Mapping[str, Any]) -> list[str]:
    """Every way ``message`` differs from ``expected`` (field name -> the engine's value, a
    :class:`Satisfies`, or :data:`UNSET`): a field not accounted for, a name the message lacks,
    a value that is not the engine's. Empty when they agree."""
    fields = message.DESCRIPTOR.fields
    names = {f.name for f in fields}
    problems = [f"{f.name}: not accounted for" for f in fields if f.name not in expected]
    problems += [f"{name}: the message has no such field" for name in expected if name not in names]
    for field in fields:
        if field.name not in expected:
            continue
        want = expected[field.name]
        if want is UNSET:
            if not _is_default(message, field):
                problems.append(f"{field.name}: set to {value(message, field.name)!r}, not unset")
            continue
        got = value(message, field.name)
        if isinstance(want, Satisfies):
            if not want.check(got):
                problems.append(f"{field.name}: {got!r} is not {want.what}")
        elif got != want:
            problems.append(f"{field.name}: {got!r}, the engine's is {want!r}")
    return problems


async def server_info_while_running(stub: Any, request: Any, info_request: Any) -> Any:
    """``GetServerInfo`` asked once ``request`` (a streamed ``Generate``) sent its first chunk, so
    that one request is running; the stream is cancelled afterwards."""
    import grpc.aio  # noqa: PLC0415 - only the engines' tests call this

    call = stub.Generate(request)
    try:
        first = await call.read()
        assert first is not grpc.aio.EOF, "the stream ended before its first chunk"
        assert first.HasField("chunk"), first
        return await stub.GetServerInfo(info_request)
    finally:
        call.cancel()

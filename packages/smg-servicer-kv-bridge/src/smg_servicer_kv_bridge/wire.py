"""The engines' publisher wire (consumed), decoded leniently.

Live PUB frames: ``[topic, 8-byte big-endian sequence, msgpack payload]``. The payload is an
array ``[ts, events, dp_rank]`` (vLLM's ``KVEventBatch``, SGLang's and TokenSpeed's
equivalents; ``dp_rank`` may be missing). Events are tagged maps (``{"type": "BlockStored",
...}``, vLLM) or legacy arrays with the tag first (``["BlockStored", ...]``).

Replay (ROUTER at the rank's replay endpoint): the request on a DEALER is ``[b"", start]``;
replies are ``[b"", seq, payload]`` (SGLang, TokenSpeed) or ``[b"", topic, seq, payload]`` (vLLM)
and the stream ends with the sequence ``0xFFFF_FFFF_FFFF_FFFF``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

END_SEQ = 0xFFFF_FFFF_FFFF_FFFF
_decoder = msgspec.msgpack.Decoder()


class MalformedFrame(ValueError):
    """A frame that does not follow the wire (wrong part count, bad sequence)."""


@dataclass(frozen=True)
class Batch:
    seq: int
    ts: float = 0.0
    events: list[Any] = field(default_factory=list[Any])
    dp_rank: int | None = None
    #: The payload could not be decoded: forwarded as an empty batch so no false gap appears.
    undecodable: bool = False


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def parse_seq(raw: bytes) -> int:
    if len(raw) != 8:
        raise MalformedFrame(f"sequence frame has {len(raw)} bytes, expected 8")
    return int.from_bytes(raw, "big")


def decode_payload(seq: int, payload: bytes) -> Batch:
    try:
        decoded: Any = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError):
        return Batch(seq, undecodable=True)
    if isinstance(decoded, dict):  # a batch encoded as a map
        as_map: dict[str, Any] = decoded  # pyright: ignore[reportUnknownVariableType]
        decoded = [as_map.get("ts"), as_map.get("events"), as_map.get("data_parallel_rank")]
    if not isinstance(decoded, list) or len(decoded) < 2 or not isinstance(decoded[1], list):  # pyright: ignore[reportUnknownArgumentType]
        return Batch(seq, undecodable=True)
    items: list[Any] = decoded  # pyright: ignore[reportUnknownVariableType]
    ts = float(items[0]) if isinstance(items[0], int | float) else 0.0
    rank = items[2] if len(items) > 2 and isinstance(items[2], int) else None
    return Batch(seq, ts, list(items[1]), rank)


def decode_live(frames: list[bytes]) -> Batch:
    if len(frames) != 3:
        raise MalformedFrame(f"live message has {len(frames)} parts, expected 3")
    return decode_payload(parse_seq(frames[1]), frames[2])


def decode_replay(frames: list[bytes]) -> tuple[int, bytes]:
    """(seq, payload) of one replay reply; ``seq == END_SEQ`` ends the replay."""
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 2:  # seq, payload
        return parse_seq(frames[0]), frames[1]
    if len(frames) == 3:  # topic, seq, payload
        return parse_seq(frames[1]), frames[2]
    raise MalformedFrame(f"replay reply has {len(frames)} parts")


def encode_batch(ts: float, events: list[Any], dp_rank: int | None = None) -> bytes:
    """A publisher payload (used by the scripted publisher in tests and the bench)."""
    return msgspec.msgpack.encode([ts, events, dp_rank])

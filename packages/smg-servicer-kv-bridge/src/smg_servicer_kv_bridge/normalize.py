"""Engine KV events -> ``KvCacheEvent`` protos, one :class:`Normalizer` per subscription.

- **Hash folding**: an int is masked to 64 bits and read as int64; bytes fold to their last 8
  bytes, big-endian, as int64.
- **Tier from ``medium``**: GPU/DEVICE -> DEVICE; CPU, CPU_PINNED, CPU_TIER1 -> HOST (cache level
  1); CPU_TIER2, DISK, NVME, STORAGE -> DISK (2); EXTERNAL, NETWORK, REMOTE, SHARED -> EXTERNAL
  (3); absent -> DEVICE; anything else is dropped as ``unknown_medium``.
- **Drops**, counted by reason in :attr:`Normalizer.dropped`: ``unknown_type``, ``malformed``,
  ``unknown_medium``, ``unsupported_ownership`` (``kvcr``), ``non_local_locality``,
  ``non_main_attention_group`` (a spec kind other than full/mla/sink-full attention; a group
  learned as non-main stays non-main for kind-less events), ``placeholder`` (no hashes or no
  tokens), ``unaligned_blocks`` (hashes x block_size != tokens, or block_size out of range),
  ``self_referencing_hashes``.
- BlockStored's tokens are sliced per block (token cells may be ``[t, t+1]`` bigrams: the first
  id is kept). Event ids increase by one for every input event, kept or dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from smg_servicer_core.proto import common_pb2 as pb

TIERS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("GPU", "DEVICE"), (pb.KV_CACHE_TIER_DEVICE, 0)),
    **dict.fromkeys(("CPU", "CPU_PINNED", "CPU_TIER1"), (pb.KV_CACHE_TIER_HOST, 1)),
    **dict.fromkeys(("CPU_TIER2", "DISK", "NVME", "STORAGE"), (pb.KV_CACHE_TIER_DISK, 2)),
    **dict.fromkeys(("EXTERNAL", "NETWORK", "REMOTE", "SHARED"), (pb.KV_CACHE_TIER_EXTERNAL, 3)),
}
MAIN_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
_INT64 = 1 << 63
_MASK = (1 << 64) - 1
MAX_BLOCK_SIZE = 1 << 31

# Field order of the legacy array form (after the tag), as vLLM declares its structs.
_LEGACY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "locality",
        "ownership",
        "session_id",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    "AllBlocksCleared": (),
}


def _items(fields: Mapping[str, Any], name: str) -> list[Any]:
    value = fields.get(name)
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise Dropped("malformed")
    return list(value)  # pyright: ignore[reportUnknownArgumentType]


class Dropped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fold_hash(value: Any) -> int:
    if isinstance(value, bool):
        raise Dropped("malformed")
    if isinstance(value, int):
        folded = value & _MASK
    elif isinstance(value, bytes | bytearray) and value:
        folded = int.from_bytes(bytes(value[-8:]), "big")
    else:
        raise Dropped("malformed")
    return folded - (1 << 64) if folded >= _INT64 else folded


def as_fields(event: Any) -> tuple[str, Mapping[str, Any]]:
    """(type, fields) of a tagged map or a legacy tagged array."""
    if isinstance(event, Mapping):
        fields: Mapping[str, Any] = event  # pyright: ignore[reportUnknownVariableType]
        return str(fields.get("type", "")), fields
    if isinstance(event, list | tuple) and event and isinstance(event[0], str):
        items: list[Any] = list(event)  # pyright: ignore[reportUnknownArgumentType]
        names = _LEGACY_FIELDS.get(items[0])
        if names is None:
            return items[0], {}
        return items[0], dict(zip(names, items[1:], strict=False))
    raise Dropped("malformed")


class Normalizer:
    def __init__(self, on_drop: Callable[[str], None] | None = None) -> None:
        self.next_event_id = 0
        self.dropped: Counter[str] = Counter()
        self.non_main_groups: set[int] = set()
        #: Called with the reason of every dropped event (metrics).
        self.on_drop = on_drop

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        if self.on_drop is not None:
            self.on_drop(reason)

    def convert(self, events: list[Any]) -> list[pb.KvCacheEvent]:
        out: list[pb.KvCacheEvent] = []
        for event in events:
            event_id = self.next_event_id
            self.next_event_id += 1
            try:
                converted = self._one(event)
            except Dropped as drop:
                self._drop(drop.reason)
                continue
            except (TypeError, ValueError, KeyError):
                self._drop("malformed")
                continue
            converted.event_id = event_id
            out.append(converted)
        return out

    def _one(self, event: Any) -> pb.KvCacheEvent:
        kind, fields = as_fields(event)
        if kind == "BlockStored":
            return pb.KvCacheEvent(stored=self._stored(fields))
        if kind == "BlockRemoved":
            return pb.KvCacheEvent(removed=self._removed(fields))
        if kind == "AllBlocksCleared":
            return pb.KvCacheEvent(cleared=pb.KvCacheCleared())
        raise Dropped("unknown_type")

    def _common(self, fields: Mapping[str, Any]) -> tuple[int, int]:
        medium = fields.get("medium")
        tier = TIERS.get(str(medium).upper()) if medium is not None else TIERS["GPU"]
        if tier is None:
            raise Dropped("unknown_medium")
        if str(fields.get("ownership") or "").lower() == "kvcr":
            raise Dropped("unsupported_ownership")
        locality = fields.get("locality")
        if locality is not None and str(locality).upper() != "LOCAL":
            raise Dropped("non_local_locality")
        group = fields.get("group_idx")
        kind = fields.get("kv_cache_spec_kind")
        if isinstance(group, int) and kind is not None:
            if kind not in MAIN_KINDS:
                self.non_main_groups.add(group)
                raise Dropped("non_main_attention_group")
            self.non_main_groups.discard(group)
        elif isinstance(group, int) and group in self.non_main_groups:
            raise Dropped("non_main_attention_group")
        return tier

    def _stored(self, fields: Mapping[str, Any]) -> pb.KvBlocksStored:
        tier, level = self._common(fields)
        hashes = [fold_hash(h) for h in _items(fields, "block_hashes")]
        tokens: list[Any] = [
            t[0] if isinstance(t, list | tuple) else t for t in _items(fields, "token_ids")
        ]
        if not hashes or not tokens:
            raise Dropped("placeholder")
        size = fields.get("block_size")
        if not isinstance(size, int) or not (0 < size < MAX_BLOCK_SIZE):
            raise Dropped("unaligned_blocks")
        if len(hashes) * size != len(tokens):
            raise Dropped("unaligned_blocks")
        parent_raw = fields.get("parent_block_hash")
        parent = fold_hash(parent_raw) if parent_raw is not None else None
        if parent is not None and parent in hashes:
            raise Dropped("self_referencing_hashes")
        lora = fields.get("lora_id")
        message = pb.KvBlocksStored(
            parent_block_hash=parent,
            tier=tier,  # pyright: ignore[reportArgumentType]
            medium=str(fields.get("medium") or "GPU"),
        )
        for index, block_hash in enumerate(hashes):
            block = message.blocks.add(
                block_hash=block_hash,
                token_ids=[int(t) for t in tokens[index * size : (index + 1) * size]],
                block_size=size,
                cache_level=level,
            )
            if isinstance(lora, int) and not isinstance(lora, bool):
                block.lora_id = fold_hash(lora)
        self._optional(message, fields)
        return message

    @staticmethod
    def _optional(message: pb.KvBlocksStored, fields: Mapping[str, Any]) -> None:
        for name in ("group_idx", "kv_cache_spec_sliding_window"):
            if isinstance(fields.get(name), int):
                setattr(message, name, fields[name])
        for name in ("kv_cache_spec_kind", "ownership", "session_id", "lora_name", "cache_salt"):
            if isinstance(fields.get(name), str):
                setattr(message, name, fields[name])
        if fields.get("locality") is not None:
            message.locality = pb.KV_CACHE_LOCALITY_LOCAL

    def _removed(self, fields: Mapping[str, Any]) -> pb.KvBlocksRemoved:
        tier, level = self._common(fields)
        hashes = [fold_hash(h) for h in _items(fields, "block_hashes")]
        if not hashes:
            raise Dropped("placeholder")
        message = pb.KvBlocksRemoved(
            block_hashes=hashes,
            cache_level=level,
            tier=tier,  # pyright: ignore[reportArgumentType]
            medium=str(fields.get("medium") or "GPU"),
        )
        if isinstance(fields.get("group_idx"), int):
            message.group_idx = fields["group_idx"]
        return message

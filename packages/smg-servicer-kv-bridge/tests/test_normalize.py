"""Engine events -> protos: hash folding, tiers, token slicing, drops by reason, event ids."""

from __future__ import annotations

import pytest

from smg_servicer_core.proto import common_pb2 as pb
from smg_servicer_kv_bridge.normalize import Normalizer, fold_hash
from smg_servicer_kv_bridge.testing import stored_event
from smg_servicer_kv_bridge.wire import decode_payload, decode_replay, encode_batch

pytestmark = pytest.mark.unit


def test_fold_hash() -> None:
    assert fold_hash(5) == 5
    assert fold_hash((1 << 64) - 1) == -1
    assert fold_hash(1 << 64 | 7) == 7
    assert fold_hash(b"\x00" * 24 + (9).to_bytes(8, "big")) == 9
    assert fold_hash(b"\xff" * 8) == -1


@pytest.mark.parametrize(
    ("medium", "tier", "level"),
    [
        (None, pb.KV_CACHE_TIER_DEVICE, 0),
        ("GPU", pb.KV_CACHE_TIER_DEVICE, 0),
        ("cpu", pb.KV_CACHE_TIER_HOST, 1),
        ("DISK", pb.KV_CACHE_TIER_DISK, 2),
        ("REMOTE", pb.KV_CACHE_TIER_EXTERNAL, 3),
    ],
)
def test_tiers(medium: str | None, tier: int, level: int) -> None:
    [event] = Normalizer().convert([stored_event([1], [7, 8], medium=medium)])
    assert event.stored.tier == tier
    assert event.stored.blocks[0].cache_level == level


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"type": "Nope"}, "unknown_type"),
        (42, "malformed"),
        (stored_event([1], [1, 2], medium="TAPE"), "unknown_medium"),
        (stored_event([1], [1, 2], ownership="kvcr"), "unsupported_ownership"),
        (stored_event([1], [1, 2], locality="REMOTE"), "non_local_locality"),
        (
            stored_event([1], [1, 2], group_idx=1, kv_cache_spec_kind="sliding_window"),
            "non_main_attention_group",
        ),
        (stored_event([], [1, 2]), "placeholder"),
        (stored_event([1, 2], [1, 2, 3], block_size=2), "unaligned_blocks"),
        (stored_event([1], [1, 2], parent_block_hash=1), "self_referencing_hashes"),
    ],
)
def test_drops_are_counted_by_reason(event: object, reason: str) -> None:
    normalizer = Normalizer()
    assert normalizer.convert([event]) == []
    assert normalizer.dropped == {reason: 1}


def test_event_ids_advance_over_dropped_events() -> None:
    normalizer = Normalizer()
    out = normalizer.convert(
        [
            stored_event([1], [1, 2]),
            {"type": "Nope"},
            {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ]
    )
    assert [e.event_id for e in out] == [0, 2, 3]
    assert [e.WhichOneof("data") for e in out] == ["stored", "removed", "cleared"]


def test_legacy_array_events_and_bigram_tokens() -> None:
    legacy = ["BlockStored", [5, 6], 4, [[1, 2], [2, 3], [3, 4], [4, 5]], 2, 9, "GPU"]
    [event] = Normalizer().convert([legacy])
    assert [list(b.token_ids) for b in event.stored.blocks] == [[1, 2], [3, 4]]
    assert event.stored.parent_block_hash == 4 and event.stored.blocks[0].lora_id == 9


def test_group_learned_as_non_main_stays_dropped() -> None:
    normalizer = Normalizer()
    normalizer.convert([stored_event([1], [1, 2], group_idx=3, kv_cache_spec_kind="mamba")])
    assert (
        normalizer.convert(
            [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 3}]
        )
        == []
    )
    assert normalizer.dropped["non_main_attention_group"] == 2


def test_wire_round_trip_and_replay_forms() -> None:
    batch = decode_payload(7, encode_batch(1.5, [{"type": "AllBlocksCleared"}], 2))
    assert (batch.seq, batch.ts, batch.dp_rank, batch.undecodable) == (7, 1.5, 2, False)
    assert decode_payload(8, b"\xc1").undecodable
    seq = (9).to_bytes(8, "big")
    assert decode_replay([b"", b"topic", seq, b"p"]) == (9, b"p")
    assert decode_replay([b"", seq, b"p"]) == (9, b"p")

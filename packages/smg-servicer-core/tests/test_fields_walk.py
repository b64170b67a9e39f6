"""``testing.fields.mismatches``: every field of an info answer accounted for and checked."""

from __future__ import annotations

import pytest

from smg_servicer_core.proto import sglang_scheduler_pb2, vllm_engine_pb2
from smg_servicer_core.testing.fields import UNSET, Satisfies, mismatches, value

pytestmark = pytest.mark.unit


def test_mismatches_name_each_way_an_answer_differs() -> None:
    info = vllm_engine_pb2.GetServerInfoResponse(block_size=16, server_type="vllm-grpc")
    names = [f.name for f in info.DESCRIPTOR.fields]
    expected = dict.fromkeys(names, UNSET) | {
        "block_size": 16,
        "server_type": "vllm-grpc",
    }
    assert mismatches(info, expected) == []
    del expected["kv_role"]
    expected |= {
        "block_size": 32,
        "active_requests": Satisfies(lambda n: n > 0, "a running count"),
        "server_type": UNSET,
        "no_such_field": 1,
    }
    assert mismatches(info, expected) == [
        "kv_role: not accounted for",
        "no_such_field: the message has no such field",
        "active_requests: 0 is not a running count",
        "server_type: set to 'vllm-grpc', not unset",
        "block_size: 16, the engine's is 32",
    ]


def test_messages_structs_and_timestamps_read_as_plain_values() -> None:
    info = sglang_scheduler_pb2.GetServerInfoResponse()
    info.server_args.update({"model_path": "m", "tp_size": 1})
    info.start_time.FromSeconds(1_800_000_000)
    assert value(info, "server_args") == {"model_path": "m", "tp_size": 1}
    assert value(info, "start_time") == 1_800_000_000
    model = sglang_scheduler_pb2.GetModelInfoResponse(eos_token_ids=[2, 0])
    assert value(model, "eos_token_ids") == [2, 0]
    names = {f.name for f in info.DESCRIPTOR.fields}
    unset = dict.fromkeys(names, UNSET)
    struct, timestamp = mismatches(info, unset)
    assert struct.startswith("server_args: set to {") and struct.endswith("}, not unset")
    assert timestamp == "start_time: set to 1800000000, not unset"
    assert mismatches(sglang_scheduler_pb2.GetServerInfoResponse(), unset) == []

"""``tensors.read_tensor``: every payload kind, every way a tensor can be wrong."""

from __future__ import annotations

import struct
from multiprocessing import shared_memory

import pytest

from smg_servicer_core.errors import InvalidRequest, Unsupported
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import sglang_scheduler_pb2 as sglang_pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as ts_pb
from smg_servicer_core.proto import vllm_engine_pb2 as vllm_pb
from smg_servicer_core.tensors import read_tensor, release_shm, shm_namespace_id

pytestmark = pytest.mark.unit
FOUR_FLOATS = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


@pytest.mark.parametrize("wire", [ts_pb, vllm_pb])
def test_inline_tensor_of_any_wire(wire: object) -> None:
    message = wire.TensorData(shape=[2, 2], dtype="float32", inline=FOUR_FLOATS)  # type: ignore[attr-defined]
    raw = read_tensor(message, "x")
    assert (raw.dtype, raw.shape, raw.data, raw.nbytes) == ("float32", (2, 2), FOUR_FLOATS, 16)


def test_sglangs_data_only_tensor_is_read_and_checked_the_same_way() -> None:
    """SGLang's ``TensorData`` has no payload oneof: its ``data`` bytes, under the same checks."""
    raw = read_tensor(sglang_pb.TensorData(shape=[4], dtype="float32", data=FOUR_FLOATS), "x")
    assert (raw.shape, raw.data) == ((4,), FOUR_FLOATS)
    with pytest.raises(InvalidRequest, match="is 8 bytes, got 16"):
        read_tensor(sglang_pb.TensorData(shape=[2], dtype="float32", data=FOUR_FLOATS), "x")
    assert release_shm([sglang_pb.TensorData(shape=[4], dtype="float32", data=FOUR_FLOATS)]) == 0


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (ts_pb.TensorData(shape=[2], dtype="complex64", inline=b"x" * 16), "dtype 'complex64'"),
        (ts_pb.TensorData(shape=[3], dtype="float32", inline=FOUR_FLOATS), "is 12 bytes, got 16"),
        (ts_pb.TensorData(shape=[4], dtype="float32"), "the tensor has no payload"),
        (ts_pb.TensorData(shape=[1 << 20, 1 << 20], dtype="uint8", inline=b""), "over the"),
    ],
)
def test_bad_tensors_are_invalid_argument(message: ts_pb.TensorData, text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        read_tensor(message, "mm.pixel_values")
    assert err.value.message.startswith("mm.pixel_values: ")
    assert text in err.value.message


def test_remote_is_unimplemented() -> None:
    message = ts_pb.TensorData(shape=[1], dtype="uint8", remote=common_pb2.RemoteTensorHandle())
    with pytest.raises(Unsupported):
        read_tensor(message, "x")


def test_shared_memory_is_read_then_unlinked() -> None:
    segment = shared_memory.SharedMemory(create=True, size=64)
    assert segment.buf is not None
    segment.buf[8:24] = FOUR_FLOATS
    handle = common_pb2.ShmHandle(name=segment.name, offset=8, nbytes=16)
    raw = read_tensor(ts_pb.TensorData(shape=[4], dtype="float32", shm=handle), "x")
    assert raw.data == FOUR_FLOATS
    segment.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=segment.name)


@pytest.mark.parametrize(
    ("handle", "text"),
    [
        (common_pb2.ShmHandle(name="../etc/passwd", nbytes=16), "is not valid"),
        (common_pb2.ShmHandle(name="smg-no-such-segment", nbytes=16), "cannot be opened"),
        (common_pb2.ShmHandle(name="x", nbytes=8), "the shared-memory handle holds 8"),
    ],
)
def test_bad_shared_memory_handles(handle: common_pb2.ShmHandle, text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        read_tensor(ts_pb.TensorData(shape=[4], dtype="float32", shm=handle), "x")
    assert text in err.value.message


def test_a_range_past_the_segment_is_refused() -> None:
    segment = shared_memory.SharedMemory(create=True, size=16)
    handle = common_pb2.ShmHandle(name=segment.name, offset=8, nbytes=16)
    with pytest.raises(InvalidRequest) as err:
        read_tensor(ts_pb.TensorData(shape=[4], dtype="float32", shm=handle), "x")
    assert "exceeds the segment" in err.value.message
    segment.close()


def test_release_frees_unread_segments_and_skips_the_rest() -> None:
    segment = shared_memory.SharedMemory(create=True, size=8)
    unread = vllm_pb.TensorData(shape=[2], dtype="float32")
    unread.shm.name, unread.shm.nbytes = segment.name, 8
    gone = vllm_pb.TensorData(shape=[2], dtype="float32")
    gone.shm.name, gone.shm.nbytes = "smg-already-gone", 8
    traversal = vllm_pb.TensorData(shape=[2], dtype="float32")
    traversal.shm.name = "../../etc/passwd"
    inline = vllm_pb.TensorData(shape=[2], dtype="float32", inline=b"\0" * 8)
    assert release_shm([unread, gone, traversal, inline]) == 1
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=segment.name)
    segment.close()


def test_the_shm_namespace_names_this_boot_and_mount() -> None:
    boot, device = shm_namespace_id().split(":")
    assert len(boot) == 36 and int(device) > 0

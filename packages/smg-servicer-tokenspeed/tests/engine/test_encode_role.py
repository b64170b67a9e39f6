"""An encode worker (``--disaggregation-mode encode``: TokenSpeed's EPD encode role) on
TokenSpeed's real front end, its encode loop stood in (``testing.scheduler.EncodeStandIn``, which
records what reaches it and, like the real loop, answers nothing).

What reaches the encode loop is TokenSpeed's own ``EncodeRequest``: the item's feature, offsets,
hash and pad value, this worker's bootstrap server and the room the router assigned. Nothing
that would wait for a reply or run the absent language model reaches it: no warm-up request,
no load query, no flush, no profile, no health probe."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.harness import stop_tree
from smg_it.tokenspeed_suite import SERVICE, Record, start_ts
from smg_servicer_core.proto import common_pb2, tokenspeed_encoder_pb2
from smg_servicer_core.proto import tokenspeed_encoder_pb2_grpc as encoder_grpc
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.process import WorkerProcess
from smg_servicer_core.testing.router import Router
from smg_servicer_tokenspeed.testing import tiny_multimodal

pytestmark = [pytest.mark.engine, pytest.mark.standin]

BOOTSTRAP_PORT = 8123
HOST_IP = "10.1.2.3"


@pytest.fixture(scope="module")
def encode_record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    return Record(tmp_path_factory.mktemp("encode") / "record.jsonl")


@pytest.fixture(scope="module")
def multimodal_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_multimodal(tiny_model, tmp_path_factory.mktemp("tiny-qwen3_5"))


@pytest.fixture(scope="module")
def encode_worker(multimodal_model: Path, encode_record: Record) -> Iterator[WorkerProcess]:
    model = multimodal_model
    server = start_ts(
        model,
        encode_record.path,
        "--disaggregation-mode", "encode",
        "--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT),
        env={"TOKENSPEED_HOST_IP": HOST_IP},
    )  # fmt: skip
    try:
        server.wait_serving()
        yield server
    finally:
        code, alive = stop_tree(server)
    assert code == 0, server.tail()
    assert not alive


@pytest.fixture(scope="module")
def channel(encode_worker: WorkerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(encode_worker.address) as ch:
        yield ch


def _image(without: str | None = None) -> pb.MultimodalItem:
    """A 2x4 float32 image item over prompt positions 3..6 (``without``: a field left out)."""
    pixels = struct.pack("<8f", *range(8))
    item = pb.MultimodalItem(
        modality=common_pb2.IMAGE,
        encoder_input=pb.TensorData(shape=[2, 4], dtype="float32", inline=pixels),
        content_hash=bytes(range(8)),
        placeholders=[pb.PlaceholderRange(offset=3, length=4)],
        placeholder_token_id=9,
    )
    if without is not None:
        item.ClearField(without)
    return item


def _encode(item: pb.MultimodalItem | None, *rooms: int, rid: str = "enc-1") -> Any:
    request = tokenspeed_encoder_pb2.EncodeRequest(
        request_id=rid,
        items=[tokenspeed_encoder_pb2.EncodeItemAssignment(bootstrap_room=r) for r in rooms],
    )
    if item is not None:
        request.mm_inputs.items.append(item)
    return request


def _until(record: Record, predicate: Any, limit_s: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + limit_s
    while not predicate(entries := record.entries()):
        assert time.monotonic() < deadline, entries
        time.sleep(0.05)
    return entries


def test_an_encode_request_reaches_the_encode_loop_as_tokenspeeds_own(
    channel: grpc.Channel, encode_record: Record
) -> None:
    encoder: Any = encoder_grpc.TokenSpeedEncoderStub(channel)
    reply = encoder.Encode(_encode(_image(), 4242), timeout=10)
    assert reply.accepted
    entries = _until(encode_record, lambda rows: any(r["type"] == "encode" for r in rows))
    (encode,) = [r for r in entries if r["type"] == "encode"]
    assert encode["request_id"] == "enc-1"
    assert encode["bootstrap"] == [HOST_IP, BOOTSTRAP_PORT, 4242]
    (item,) = encode["items"]
    assert item["modality"] == "IMAGE" and item["offsets"] == [[3, 6]]
    assert item["shape"] == [2, 4] and item["dtype"] == "bfloat16"  # the encoder's dtype
    assert item["hash"] == int.from_bytes(bytes(range(8)), "little")
    assert item["pad_value"] is not None
    # Nothing else reached the encode loop: no warm-up request, nothing it would not answer.
    assert [r["type"] for r in entries] == ["encode"]


@pytest.mark.parametrize(
    ("request_", "detail"),
    [
        (_encode(None, 1), "mm_inputs is required"),
        (_encode(_image(), 1, 2), "exactly one item and one room"),
        (_encode(_image(), rid="no-room"), "exactly one item and one room"),
        (_encode(_image(without="encoder_input"), 1), "encoder_input is required"),
        (_encode(_image(without="placeholders"), 1), "placeholders must not be empty"),
    ],
    ids=["no-items", "two-rooms", "no-room", "no-pixels", "no-placeholders"],
)
def test_a_malformed_encode_request_is_invalid_argument(
    channel: grpc.Channel, encode_record: Record, request_: Any, detail: str
) -> None:
    encoder: Any = encoder_grpc.TokenSpeedEncoderStub(channel)
    before = len(encode_record.entries())
    with pytest.raises(grpc.RpcError) as err:
        encoder.Encode(request_, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # pyright: ignore[reportAttributeAccessIssue]
    assert detail in (err.value.details() or "")  # pyright: ignore[reportAttributeAccessIssue]
    assert len(encode_record.entries()) == before


def test_every_info_field_is_tokenspeeds_own(
    encode_worker: WorkerProcess, multimodal_model: Path, walk_info: Any
) -> None:
    """The encode worker: a multimodal model, no KV pool, and no request that could run."""
    assert walk_info(encode_worker, multimodal_model, running=False) == []


def test_the_scheduler_service_answers_discovery_and_refuses_the_rest(
    channel: grpc.Channel, encode_record: Record
) -> None:
    """What the router calls on a worker it registers answers at once; Generate and the control
    RPCs are refused before anything reaches the encode loop, which would never answer."""
    stub = pb_grpc.TokenSpeedSchedulerStub(channel)
    before = encode_record.entries()
    started = time.monotonic()
    health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
    assert health.healthy
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).vocab_size > 0
    server_info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert not server_info.is_paused
    loads = stub.GetLoads(pb.GetLoadsRequest(), timeout=10)
    assert list(loads.loads) == [] and loads.dp_rank_count == 0
    health_stub: Any = health_pb2_grpc.HealthStub(channel)
    served = health_stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
    assert served.status == health_pb2.HealthCheckResponse.SERVING
    assert time.monotonic() - started < 5, "a discovery call waited on the encode loop"

    request = pb.GenerateRequest(
        request_id="gen", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(max_new_tokens=2),
    )  # fmt: skip
    with pytest.raises(grpc.RpcError) as generate:
        list(stub.Generate(request, timeout=10))
    assert generate.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # pyright: ignore[reportAttributeAccessIssue]
    assert "encode worker" in (generate.value.details() or "")  # pyright: ignore[reportAttributeAccessIssue]
    control = {
        "FlushCache": lambda: stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=10),
        "StartProfile": lambda: stub.StartProfile(common_pb2.StartProfileRequest(), timeout=10),
        "StopProfile": lambda: stub.StopProfile(common_pb2.StopProfileRequest(), timeout=10),
    }
    for name, call in control.items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, name  # pyright: ignore[reportAttributeAccessIssue]
        assert name in (refused.value.details() or "")  # pyright: ignore[reportAttributeAccessIssue]
    assert encode_record.entries() == before


def test_an_encode_worker_of_a_text_model_is_a_configuration_error(
    tiny_model: Path, tmp_path: Path
) -> None:
    """TokenSpeed refuses the encode role for a text-only model: exit 2, its reason in one line,
    no traceback, nothing left running."""
    server = start_ts(tiny_model, tmp_path / "record.jsonl", "--disaggregation-mode", "encode")
    assert server.proc.wait(timeout=120) == 2, server.tail()
    log = server.tail()
    assert (
        "invalid configuration: TokenSpeed refused it: disaggregation_mode=encode requires a "
        "multimodal checkpoint" in log
    )
    assert "Traceback" not in log
    _, alive = stop_tree(server)
    assert not alive


def test_the_routers_epd_mode_registers_the_encode_worker_and_serves_text(
    encode_worker: WorkerProcess,
    encode_record: Record,
    multimodal_model: Path,
    tmp_path: Path,
) -> None:
    """``smg launch --epd-disaggregation``: the encode worker registers as one (through the
    scheduler service's discovery calls, its loads polled), next to a prefill and a decode
    worker; a text chat goes through prefill and decode; nothing reached the encode loop."""
    before = encode_record.entries()
    roles = {
        role: start_ts(multimodal_model, tmp_path / f"{role}.jsonl", "--disaggregation-mode", role)
        for role in ("prefill", "decode")
    }
    try:
        for server in roles.values():
            server.wait_serving()
        encode_url = f"grpc://{encode_worker.address}"
        prefill, decode = (f"grpc://{roles[r].address}" for r in ("prefill", "decode"))
        with Router(
            encode_url,
            "--epd-disaggregation",
            "--encode", encode_url,
            "--prefill", prefill, str(BOOTSTRAP_PORT + 1),
            "--decode", decode,
        ) as router:  # fmt: skip
            workers = httpx.get(router.base + "/workers", timeout=10).json()["workers"]
            types = {w["url"]: w["worker_type"] for w in workers}
            assert types == {encode_url: "encode", prefill: "prefill", decode: "decode"}, types
            reply = httpx.post(
                router.base + "/v1/chat/completions",
                json={
                    "model": str(multimodal_model),
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 3,
                },
                timeout=120,
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 3
    finally:
        for server in roles.values():
            stop_tree(server)
    assert encode_record.entries() == before

"""TokenSpeed's EPD roles on its real front end: an encode worker (``--disaggregation-mode
encode``), a prefill and a decode, the router in front of them (``smg launch
--epd-disaggregation``), and an image carried from the encode worker to the prefill by
TokenSpeed's own transfer path.

The encode worker runs TokenSpeed's own encode loop (``run_encode_loop``: its encode worker,
scheduler, embedding cache, executor, Mooncake sender and bootstrap server) with the vision tower
stood in; the prefill receives with TokenSpeed's own admission (``make_epd_prefill_admission``:
its embedding manager and receive job); Mooncake moves the bytes over TCP. What runs where, and
what is stood in (the tower, Mooncake's CUDA build, the language model, the P→D KV transfer), is
in :mod:`smg_servicer_tokenspeed.testing.epd`.

What reaches the encode loop is TokenSpeed's own ``EncodeRequest``: the item's feature, offsets,
hash and pad value, this worker's bootstrap server and the room the router assigned. Nothing
that would wait for a reply or run the absent language model reaches it: no warm-up request,
no load query, no flush, no profile, no health probe."""

from __future__ import annotations

import base64
import io
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.harness import free_port, stop_tree
from smg_it.tokenspeed_suite import SERVICE, Record, start_ts
from smg_servicer_core.proto import common_pb2, tokenspeed_encoder_pb2
from smg_servicer_core.proto import tokenspeed_encoder_pb2_grpc as encoder_grpc
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.process import WorkerProcess
from smg_servicer_core.testing.router import Router
from smg_servicer_tokenspeed.testing import tiny_multimodal

pytestmark = [pytest.mark.engine, pytest.mark.standin]

#: Where the encode worker says its bootstrap server is (TOKENSPEED_HOST_IP, which the servicer
#: reads): the prefill dials it there.
HOST_IP = "127.0.0.1"


@pytest.fixture(scope="module")
def bootstrap_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Record]:
    folder = tmp_path_factory.mktemp("records")
    return {role: Record(folder / f"{role}.jsonl") for role in ("encode", "prefill", "decode")}


@pytest.fixture(scope="module")
def encode_record(records: dict[str, Record]) -> Record:
    return records["encode"]


@pytest.fixture(scope="module")
def multimodal_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_multimodal(tmp_path_factory.mktemp("tiny-qwen3_5"))


@pytest.fixture(scope="module")
def workers(
    multimodal_model: Path,
    records: dict[str, Record],
    bootstrap_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, WorkerProcess]]:
    """The three EPD roles, started together: the encode worker and the prefill on TokenSpeed's
    transfer path (``epd_transfer``), the prefill and the decode on the P→D stand-in
    (``handoff_dir``)."""
    handoff = str(tmp_path_factory.mktemp("handoff"))
    model = multimodal_model
    started = {
        "encode": start_ts(
            model, records["encode"].path, "--disaggregation-mode", "encode",
            "--disaggregation-bootstrap-port", str(bootstrap_port),
            env={"TOKENSPEED_HOST_IP": HOST_IP}, epd_transfer=True,
        ),
        "prefill": start_ts(
            model, records["prefill"].path, "--disaggregation-mode", "prefill",
            epd_transfer=True, handoff_dir=handoff,
        ),
        "decode": start_ts(
            model, records["decode"].path, "--disaggregation-mode", "decode", handoff_dir=handoff
        ),
    }  # fmt: skip
    try:
        for server in started.values():
            server.wait_serving()
        yield started
    finally:
        stopped = {role: stop_tree(server) for role, server in started.items()}
    for role, (code, alive) in stopped.items():
        assert code == 0, started[role].tail()
        assert not alive, role


@pytest.fixture(scope="module")
def encode_worker(workers: dict[str, WorkerProcess]) -> WorkerProcess:
    return workers["encode"]


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
    channel: grpc.Channel, encode_record: Record, bootstrap_port: int
) -> None:
    """Its room has no prefill: TokenSpeed's sender parks the embedding until its reaper
    fails the room (the module's workers stop first)."""
    encoder: Any = encoder_grpc.TokenSpeedEncoderStub(channel)
    reply = encoder.Encode(_encode(_image(), 4242), timeout=10)
    assert reply.accepted
    entries = _until(encode_record, lambda rows: any(r["type"] == "embedded" for r in rows))
    (encode,) = [r for r in entries if r["type"] == "encode"]
    assert encode["request_id"] == "enc-1"
    assert encode["bootstrap"] == [HOST_IP, bootstrap_port, 4242]
    (item,) = encode["items"]
    assert item["modality"] == "IMAGE" and item["offsets"] == [[3, 6]]
    assert item["shape"] == [2, 4] and item["dtype"] == "bfloat16"  # the encoder's dtype
    assert item["hash"] == int.from_bytes(bytes(range(8)), "little")
    assert item["pad_value"] is not None
    # The tower ran on it (a row per placeholder position); nothing else reached the encode
    # loop: no warm-up request, nothing it would not answer.
    assert [r["type"] for r in entries] == ["encode", "embedded"]
    assert entries[1]["rows"] == 4 and entries[1]["hash"] == item["hash"]


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


@pytest.fixture(scope="module")
def router(workers: dict[str, WorkerProcess], bootstrap_port: int) -> Iterator[Router]:
    """``smg launch --epd-disaggregation``, pictures preprocessed by the router (the only way
    it routes one through an encode worker)."""
    urls = {role: f"grpc://{server.address}" for role, server in workers.items()}
    with Router(
        urls["encode"],
        "--epd-disaggregation",
        "--encode", urls["encode"], str(bootstrap_port),
        "--prefill", urls["prefill"], str(free_port()),
        "--decode", urls["decode"],
        "--mm-processing", "router",
    ) as router:  # fmt: skip
        yield router


def _png(seed: int) -> str:
    """A 56 x 56 noise picture (a 1 x 4 x 4 patch grid: 4 prompt positions), as a data URL."""
    import random

    from PIL import Image

    rng = random.Random(seed)
    noise = bytes(rng.randrange(256) for _ in range(56 * 56 * 3))
    picture = Image.frombytes("RGB", (56, 56), noise)
    out = io.BytesIO()
    picture.save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _chat(router: Router, model: Path, picture: str | None) -> dict[str, Any]:
    content: Any = "hello"
    if picture is not None:
        content = [{"type": "text", "text": "what is this"},
                   {"type": "image_url", "image_url": {"url": picture}}]  # fmt: skip
    reply = httpx.post(
        router.base + "/v1/chat/completions",
        json={"model": str(model), "messages": [{"role": "user", "content": content}],
              "max_tokens": 4, "temperature": 0},
        timeout=120,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    assert body["usage"]["completion_tokens"] == 4
    return body


def _new(records: dict[str, Record], before: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    return {role: record.entries()[before[role] :] for role, record in records.items()}


def test_the_routers_epd_mode_registers_the_encode_worker_and_serves_text(
    router: Router, workers: dict[str, WorkerProcess], records: dict[str, Record],
    multimodal_model: Path,
) -> None:  # fmt: skip
    """The encode worker registers as one (through the scheduler service's discovery calls,
    its loads polled), next to a prefill and a decode worker; a text chat goes through prefill
    and decode; nothing reached the encode loop."""
    urls = {f"grpc://{server.address}": role for role, server in workers.items()}
    listed = httpx.get(router.base + "/workers", timeout=10).json()["workers"]
    assert {w["url"]: w["worker_type"] for w in listed} == urls
    before = {role: len(record.entries()) for role, record in records.items()}
    _chat(router, multimodal_model, None)
    new = _new(records, before)
    assert new["encode"] == []
    assert [r["type"] for r in new["prefill"]] == ["generate"]  # nothing staged
    (handoff,) = [r for r in new["decode"] if r["type"] == "handoff"]
    assert handoff["digest"] == 0  # the prefill received no embedding


def test_an_image_crosses_from_the_encode_worker_to_the_prefill_on_tokenspeeds_path(
    router: Router, records: dict[str, Record], multimodal_model: Path, bootstrap_port: int
) -> None:
    """An image chat: the router preprocesses the picture and sends it to the encode worker with
    a room; TokenSpeed's encode loop embeds it (the stood-in tower) and its sender ships the
    rows to the prefill, whose admission received exactly those rows before the request ran;
    the decode continued from that prefill. The same picture again is a cache hit in the encode
    worker (the tower does not run; the cached rows are shipped), and gives the same answer;
    another picture gives other rows and another answer."""
    answers: list[list[int]] = []  # the decode's tokens (the tiny tokenizer's text may be empty)
    digests: list[int] = []
    for index, seed in enumerate((1, 2, 1)):
        before = {role: len(record.entries()) for role, record in records.items()}
        body = _chat(router, multimodal_model, _png(seed))
        assert body["choices"][0]["finish_reason"] == "length"
        new = _new(records, before)
        (encode,) = [r for r in new["encode"] if r["type"] == "encode"]
        host, port, room = encode["bootstrap"]
        assert (host, port) == (HOST_IP, bootstrap_port)
        (item,) = encode["items"]
        assert item["modality"] == "IMAGE" and item["shape"] == [16, 1176]  # 16 patches
        ((start, end),) = item["offsets"]
        assert end - start + 1 == 4  # merged 2 x 2: 4 prompt positions
        embedded = [r for r in new["encode"] if r["type"] == "embedded"]
        if index == 2:
            assert embedded == []  # TokenSpeed's embedding cache: the tower did not run
        else:
            assert [(e["hash"], e["rows"]) for e in embedded] == [(item["hash"], 4)]
            digests.append(embedded[0]["digest"])
        (staged,) = [r for r in new["prefill"] if r["type"] == "staged"]
        assert staged["handshakes"] == [
            {"bootstrap_host": HOST_IP, "bootstrap_port": bootstrap_port, "bootstrap_room": room}
        ]
        (received,) = [r for r in new["prefill"] if r["type"] == "embedding"]
        assert received["rooms"] == [room] and received["shapes"] == [[4, 64]]
        assert received["dtype"] == "float32"
        assert received["digests"] == [digests[0 if index == 2 else index]]
        kinds = [r["type"] for r in new["prefill"]]
        assert kinds.index("embedding") < kinds.index("generate"), kinds  # admitted, then run
        (handoff,) = [r for r in new["decode"] if r["type"] == "handoff"]
        assert handoff["digest"] == received["digest"]
        (answer,) = [r for r in new["decode"] if r["type"] == "answer"]
        assert len(answer["tokens"]) == 4
        answers.append(answer["tokens"])
    assert digests[0] != digests[1]
    assert answers[0] == answers[2] != answers[1], answers


def test_tokenspeeds_own_mooncake_build_is_the_boundary() -> None:
    """What is stood in, shown: TokenSpeed's transfer-engine wrapper refuses Mooncake's stock
    build (it lacks the KV path's page-gathered write, which TokenSpeed's CUDA-linked
    ``tokenspeed-mooncake`` has); the stand-in gives it one that raises, and the embedding path
    above never calls it."""
    from tokenspeed.runtime.pd.base.mooncake_engine import MooncakeTransferEngine  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    with pytest.raises(RuntimeError, match="lacks batch_transfer_sync_write_pages"):
        MooncakeTransferEngine(hostname=HOST_IP, gpu_id=0)

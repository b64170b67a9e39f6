"""Router-preprocessed tensors against the real vLLM engine (the session's tiny-VLM worker, shared
with the router image tests): placeholder runs (short, long, zero, overlapping, out of range, a
mask that disagrees), tensor sizes and shapes, dtypes, hashes and shared-memory names. Every broken
request answers a client-fault code naming its fault, the few valid variants are served, and the
engine serves a normal request afterwards: no request kills it (before these checks a short run
was silently misaligned, and a wrong tile size, dtype, tensor set, sizes tensor, modality or an
all-zero tile killed EngineCore).

Seeded (``SMG_FUZZ_SEED``); ``SMG_FUZZ_TENSOR_EXAMPLES`` sets the drawn combinations.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, seed, settings

from smg_it.fuzz_mm import CASES, Case, Vlm, case, good, must_refuse, mutated_requests
from smg_it.harness import Worker
from smg_it.reliability import CLIENT_FAULT
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.proto import vllm_engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

EXAMPLES = int(os.environ.get("SMG_FUZZ_TENSOR_EXAMPLES", "60"))
SEED = int(os.environ.get("SMG_FUZZ_SEED", "20261202"))
SUPPRESSED = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


def answer(
    stub: pb_grpc.VllmEngineStub, request: pb.GenerateRequest
) -> tuple[grpc.StatusCode, str]:
    try:
        for _ in stub.Generate(request, timeout=60):
            pass
    except grpc.RpcError as err:
        return err.code(), err.details() or ""  # pyright: ignore[reportAttributeAccessIssue]
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def vlm(tiny_vlm: Path) -> Vlm:
    return Vlm.of(tiny_vlm)


@pytest.fixture(scope="module")
def stub(vlm_worker: Worker) -> pb_grpc.VllmEngineStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{vlm_worker.port}")
    return pb_grpc.VllmEngineStub(channel)


def sent(stub: pb_grpc.VllmEngineStub, built: Case) -> tuple[grpc.StatusCode, str]:
    try:
        return answer(stub, built.request)
    finally:
        built.cleanup()


def assert_still_serving(stub: pb_grpc.VllmEngineStub, vlm: Vlm) -> None:
    assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=30).healthy
    code, details = sent(stub, good(vlm, 2, seed=11, shm=True))
    assert code == grpc.StatusCode.OK, details


def test_a_good_tensor_request_is_served_inline_and_in_shared_memory(stub, vlm) -> None:
    for shm in (False, True):
        built = good(vlm, 2, shm=shm)
        code, details = sent(stub, built)
        assert code == grpc.StatusCode.OK, details
        assert not any(Path("/dev/shm", s.name).exists() for s in built.segments)


def test_every_broken_tensor_request_gets_a_client_fault(stub, vlm) -> None:
    wrong: list[str] = []
    for name in CASES:
        code, details = sent(stub, case(vlm, name))
        if must_refuse(name):
            if code not in CLIENT_FAULT or not details:
                wrong.append(f"{name}: {code.name} {details!r}")
        elif code != grpc.StatusCode.OK:
            wrong.append(f"{name}: {code.name} {details!r} (should be served)")
    assert not wrong, "\n".join(wrong)
    assert_still_serving(stub, vlm)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("placeholder: short run, masked", "3 embedding positions, fewer than the 4"),
        ("placeholder: short run, no mask", "3 embedding positions, fewer than the 4"),
        ("placeholder: long run, no mask", "7 embedding positions, more than the 4"),
        ("shape: 28x28 tile", "pixel_values has shape [1, 3, 28, 28]; this model takes"),
        ("dtype: int64 pixels", "pixel_values is int64; this model takes a floating"),
        ("sizes: more than the pixels", "'num_patches' adds up to 2, pixel_values has 1"),
        ("pixels: an all-zero tile", "the tile is all zeros"),
        ("hashes: one for two different images", "names two image items"),
        ("modality: video", "does not accept video input"),
        ("shm: ../etc/passwd", "is not valid"),
    ],
)
def test_the_refusal_names_the_field(stub, vlm, name: str, words: str) -> None:
    code, details = sent(stub, case(vlm, name))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert words in details


def test_drawn_combinations_get_ok_or_a_client_fault(stub, vlm) -> None:
    codes: Counter[str] = Counter()
    failures: list[str] = []

    @seed(SEED)
    @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=False,
              suppress_health_check=SUPPRESSED, print_blob=True)  # fmt: skip
    @given(built=mutated_requests(vlm))
    def check(built: Case) -> None:
        request = str(built.request)[:2000]
        code, details = sent(stub, built)
        codes[code.name] += 1
        if not (code == grpc.StatusCode.OK or (code in CLIENT_FAULT and details)):
            failures.append(f"{code.name} {details!r}")
        assert code == grpc.StatusCode.OK or (code in CLIENT_FAULT and details), (
            f"{code.name} {details!r} for {request}"
        )

    check()
    assert not failures
    assert sum(codes.values()) > 0
    assert_still_serving(stub, vlm)

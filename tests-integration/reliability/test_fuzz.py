"""Fuzzed requests against the real engines: every answer is OK or names the client's fault
(never INTERNAL or UNKNOWN), the worker stays healthy, and the reference request still gets the
reference tokens afterwards.

Seeded (``SMG_FUZZ_SEED``) and replayable; ``SMG_FUZZ_EXAMPLES`` sets the count per engine. A
failing example prints as the request it was; it then becomes a regular test below.
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from smg_it.fuzz import generate_requests
from smg_it.reliability import CLIENT_FAULT, Target, record, service_name

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

EXAMPLES = int(os.environ.get("SMG_FUZZ_EXAMPLES", "250"))
SEED = int(os.environ.get("SMG_FUZZ_SEED", "20261202"))
ANSWER_TIMEOUT_S = 60.0
#: Slow examples are the engine's time, not a flaw in the strategy.
SUPPRESSED = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


def answer(stub: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    try:
        for _ in stub.Generate(request, timeout=ANSWER_TIMEOUT_S):
            pass
    except grpc.RpcError as err:
        return err.code(), err.details() or ""  # pyright: ignore[reportAttributeAccessIssue]
    return grpc.StatusCode.OK, ""


def assert_fine(target: Target, code: grpc.StatusCode, details: str, what: object) -> None:
    assert code == grpc.StatusCode.OK or code in CLIENT_FAULT, (
        f"{target.engine}: {code.name} {details!r} for {what}"
    )
    if code != grpc.StatusCode.OK:
        assert details, f"{target.engine}: {code.name} without a message for {what}"


def assert_still_serving(target: Target) -> None:
    with grpc.insecure_channel(target.address) as channel:
        stub = target.stub(channel)
        assert stub.HealthCheck(target.pb.HealthCheckRequest(), timeout=30).healthy
        assert target.generate_reference(stub) == target.reference


def test_fuzzed_requests_get_ok_or_a_client_fault(shared: Target) -> None:
    codes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    failures: list[str] = []
    with grpc.insecure_channel(shared.address) as channel:
        stub = shared.stub(channel)

        @seed(SEED)
        @settings(
            max_examples=EXAMPLES,
            database=None,
            deadline=None,
            derandomize=False,
            suppress_health_check=SUPPRESSED,
            print_blob=True,
        )
        @given(request=generate_requests(shared.engine, shared.vocab_size, shared.context_length))
        def check(request: Any) -> None:
            code, details = answer(stub, request)
            codes[code.name] += 1
            reasons[re.sub(r"-?\d[\d.e+-]*", "N", details)[:50]] += 1
            if not (code == grpc.StatusCode.OK or (code in CLIENT_FAULT and details)):
                failures.append(f"{code.name} {details!r}")
            assert_fine(shared, code, details, request)

        try:
            check()
        finally:
            record(shared.engine, fuzz_cases=sum(codes.values()), fuzz_failures=len(failures),
                   fuzz_codes=dict(codes), fuzz_reasons=dict(reasons.most_common(12)))  # fmt: skip
    assert_still_serving(shared)


def test_malformed_bytes_get_a_client_fault(shared: Target) -> None:
    """Bytes that are not a GenerateRequest, sent raw on the Generate method."""
    codes: Counter[str] = Counter()
    with grpc.insecure_channel(shared.address) as channel:
        raw = channel.unary_stream(f"/{service_name(shared.engine)}/Generate")

        @seed(SEED)
        @settings(max_examples=60, database=None, deadline=None, print_blob=True,
                  suppress_health_check=SUPPRESSED)  # fmt: skip
        @given(
            payload=st.one_of(
                st.binary(max_size=64),
                st.sampled_from([b"\xff" * 16, b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05abc"]),
            )
        )
        def check(payload: bytes) -> None:
            try:
                for _ in raw(payload, timeout=ANSWER_TIMEOUT_S):
                    pass
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as err:
                code, details = err.code(), err.details() or ""  # pyright: ignore[reportAttributeAccessIssue]
            codes[code.name] += 1
            assert_fine(shared, code, details, payload)

        try:
            check()
        finally:
            record(shared.engine, malformed_cases=sum(codes.values()), malformed_codes=dict(codes))
    assert_still_serving(shared)


def test_duplicate_and_unknown_request_ids(shared: Target) -> None:
    """Two streams under one id at once, then an Abort of an id nobody sent."""
    results: list[tuple[grpc.StatusCode, str]] = []
    with grpc.insecure_channel(shared.address) as channel:
        stub = shared.stub(channel)
        request = shared.request(
            [1, 2, 3], max_tokens=64, stream=True, request_id="dup-id", ignore_eos=True
        )
        threads = [
            threading.Thread(target=lambda: results.append(answer(stub, request))) for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(ANSWER_TIMEOUT_S)
        for code, details in results:
            assert_fine(shared, code, details, "a duplicate request id")
        assert grpc.StatusCode.OK in [code for code, _ in results]
        try:
            stub.Abort(shared.abort_request("nobody-sent-this"), timeout=30)
        except grpc.RpcError as err:
            raise AssertionError(f"Abort of an unknown id: {err.code().name}") from err  # pyright: ignore[reportAttributeAccessIssue]
    assert_still_serving(shared)


#: Just past the 256 MiB our servers take (vLLM's own launcher takes any size).
OVERSIZED_BYTES = 260 << 20


def test_an_oversized_message_gets_a_client_fault(shared: Target) -> None:
    """A GenerateRequest past the receive limit: RESOURCE_EXHAUSTED from the server's limit, or,
    where the launcher sets none (vLLM's), INVALID_ARGUMENT from the servicer's own bounds."""
    request = shared.request([1, 2, 3], max_tokens=4, request_id="o" * OVERSIZED_BYTES)
    with grpc.insecure_channel(
        shared.address, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        code, details = answer(shared.stub(channel), request)
    del request
    record(shared.engine, oversized_code=code.name)
    assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT), code
    assert len(details) < 300, "the refusal does not echo the request"
    assert_still_serving(shared)


def test_sampling_at_the_edges_is_served(shared: Target) -> None:
    """Fuzz finds, kept: a ``top_k`` at and past the vocabulary (mlx-lm's filter refused it inside
    the batch step, which ended the MLX engine), and a negative seed where the wire's seed is
    signed (MLX's PRNG key refused it). Each is served, except where an engine documents a limit:
    TokenSpeed's fused sampling kernel takes ``top_k`` below 128, and says so (a client fault)."""
    cases: list[dict[str, int]] = [{"top_k": shared.vocab_size}, {"top_k": 2**31 - 1}]
    if shared.engine in ("mlx", "vllm"):
        cases.append({"seed": -(2**31)})
    with grpc.insecure_channel(shared.address) as channel:
        stub = shared.stub(channel)
        for sampling in cases:
            request = shared.request([1, 2, 3], max_tokens=8, temperature=1.0, ignore_eos=True,
                                     **sampling)  # fmt: skip
            code, details = answer(stub, request)
            assert_fine(shared, code, details, sampling)
            if shared.engine == "tokenspeed" and "top_k" in sampling:
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "top_k" in details
            else:
                assert code == grpc.StatusCode.OK, f"{shared.engine} {sampling}: {details!r}"
    assert_still_serving(shared)

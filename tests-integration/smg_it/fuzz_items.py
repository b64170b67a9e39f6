"""A seeded fuzz of one good router-preprocessed vLLM request (the video and audio engine tests,
issue #45): up to three named faults together, then a drawn placeholder, tensor shape or dtype.
A request still broken after the draws must be INVALID_ARGUMENT, the others may be served (a
drawn placeholder holding all the item's positions, and only inside the prompt, is a good one);
the worker stays healthy after each, and the good request's answer is the same at the end.

``faults``: name -> (what it does to the request's ``mm_inputs``, the text its refusal holds);
``undone_by``: which faults a drawn ``dtype``, ``shape`` or ``span`` replaces."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from smg_servicer_core.proto import vllm_engine_pb2 as pb

SEED = int(os.environ.get("SMG_FUZZ_SEED", "20261202"))
SUPPRESSED = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
DTYPES = ("float32", "float16", "bfloat16", "int32", "uint8", "bool", "complex64", "")


def broken(good: pb.GenerateRequest, faults: Mapping[str, Any], names: Sequence[str]) -> Any:
    """``good`` with the named faults applied in turn (one needing what an earlier one removed
    is left out)."""
    request = pb.GenerateRequest()
    request.CopyFrom(good)
    for name in names:
        with contextlib.suppress(IndexError):
            faults[name][0](request.mm_inputs)
    return request


async def answer(stub: Any, request: pb.GenerateRequest) -> tuple[grpc.StatusCode, Any]:
    """The code and, served, the greedy ids (else the refusal's details)."""
    try:
        replies = [r async for r in stub.Generate(request)]
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, list(replies[-1].complete.output_ids)


async def each_fault_is_refused(
    stub: Any, good: pb.GenerateRequest, want: list[int], faults: Mapping[str, Any]
) -> None:
    """Every fault alone: INVALID_ARGUMENT holding its text, the worker healthy after it; the
    good request answered ``want`` after all of them."""
    for name, (_, text) in faults.items():
        code, details = await answer(stub, broken(good, faults, [name]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (name, code, details)
        assert text in details, (name, details)
        assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy, name
    assert await answer(stub, good) == (grpc.StatusCode.OK, want)


async def fuzz(
    stub: Any,
    good: pb.GenerateRequest,
    want: list[int],
    faults: Mapping[str, Any],
    *,
    undone_by: Mapping[str, Sequence[str]],
    examples: int,
) -> dict[str, int]:
    """The fuzz (module docstring); the count of each answer's code."""
    batch = good.mm_inputs
    original = {"dtype": batch.pixel_values.dtype, "shape": list(batch.pixel_values.shape)}
    ids, token = list(good.tokenized.input_ids), batch.im_token_id
    embeds = ids.count(token)
    drawn: list[tuple[pb.GenerateRequest, bool, str]] = []

    @seed(SEED)
    @settings(max_examples=examples, deadline=None, suppress_health_check=SUPPRESSED)
    @given(
        names=st.lists(st.sampled_from(sorted(faults)), max_size=3, unique=True),
        span=st.none() | st.tuples(st.integers(0, len(ids) + 8), st.integers(0, len(ids) + 8)),
        shape=st.none() | st.lists(st.integers(0, 64), max_size=6),
        dtype=st.none() | st.sampled_from(DTYPES),
    )
    def draw(names: list[str], span: Any, shape: Any, dtype: Any) -> None:
        bad = broken(good, faults, names)
        values = {"dtype": dtype, "shape": shape, "span": span}
        undone = {f for k, v in values.items() if v is not None for f in undone_by.get(k, ())}
        still = bool(set(names) - undone)
        batch = bad.mm_inputs
        if span is not None and batch.mm_placeholders:
            batch.mm_placeholders[0].offset, batch.mm_placeholders[0].length = span
        if shape is not None:
            batch.pixel_values.shape[:] = shape
        if dtype is not None:
            batch.pixel_values.dtype = dtype
        still |= any(values[k] is not None and values[k] != original[k] for k in original)
        if span is not None:  # a span holding all the item's positions, and only in the prompt
            offset, length = span
            window = ids[offset : offset + length]
            still |= offset + length > len(ids) or window.count(token) != embeds
        drawn.append((bad, still, f"{names} span={span} shape={shape} dtype={dtype!r}"))

    draw()  # hypothesis draws synchronously; the requests go out on the caller's loop
    seen: dict[str, int] = {}
    for bad, still, what in drawn:
        code, _ = await answer(stub, bad)
        allowed = {grpc.StatusCode.INVALID_ARGUMENT} | (set() if still else {grpc.StatusCode.OK})
        assert code in allowed, (what, code)
        seen[code.name] = seen.get(code.name, 0) + 1
        assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy, what
    assert seen.get("INVALID_ARGUMENT", 0) > len(drawn) // 2, seen
    assert await answer(stub, good) == (grpc.StatusCode.OK, want)
    return seen

"""mm_bench's request builders: the tensor requests it times are what the servicer accepts."""

from __future__ import annotations

from typing import Any

import mm_bench
import pytest


@pytest.mark.contract
@pytest.mark.parametrize("shm", [False, True])
def test_tensor_requests_hold_the_stated_bytes_and_one_placeholder(shm: bool) -> None:
    segments: list[Any] = []
    request = mm_bench.tensor_request(16, 4097, 8, segments if shm else None)
    batch = request.mm_inputs
    sizes = [
        m.shm.nbytes if shm else len(m.inline)
        for m in (batch.pixel_values, *batch.model_specific_tensors.values())
    ]
    assert sum(sizes) == 16 * mm_bench.PATCH_BYTES + 8  # + the int64 patch count
    assert list(request.tokenized.input_ids).count(4097) == batch.mm_placeholders[0].length == 64
    assert len(segments) == (3 if shm else 0)
    for segment in segments:
        segment.close()
        segment.unlink()

"""sidecar_bench's requests: each carries its own image (no cache can serve a repeat)."""

from __future__ import annotations

import argparse

import pytest
import sidecar_bench


@pytest.mark.unit
def test_every_request_has_a_distinct_image() -> None:
    args = argparse.Namespace(image_px=[16, 32], requests=3, source="data")
    urls = sidecar_bench.source_urls(args, media=None)  # pyright: ignore[reportArgumentType]
    assert sorted(urls) == [16, 32]
    flat = [u for size in urls.values() for u in size]
    assert len(set(flat)) == 6 and all(u.startswith("data:image/png;base64,") for u in flat)
    requests = sidecar_bench.image_requests([1, 4097, 2], urls[16], 4)
    assert [r.media_refs.items[0].url for r in requests] == urls[16]
    assert {r.sampling_params.max_tokens for r in requests} == {4}
    assert all(r.sampling_params.ignore_eos for r in requests)

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from pathlib import Path

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from smg_servicer_core.errors import FailedPrecondition
from smg_servicer_core.tokenizer_bundle import (
    CHUNK_SIZE,
    TokenizerBundleCache,
    build_bundle,
    select_files,
)


@pytest.mark.unit
def test_only_allow_listed_files_are_selected(tokenizer_dir: Path) -> None:
    names = [n for n, _ in select_files(tokenizer_dir)]
    assert names == [
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "chat_template.jinja",
    ]


@pytest.mark.unit
def test_symlink_leaving_the_directory_is_not_shipped(tokenizer_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0")
    (tokenizer_dir / "vocab.json").symlink_to(outside)
    names = [n for n, _ in select_files(tokenizer_dir)]
    assert "vocab.json" not in names


@pytest.mark.unit
def test_hf_cache_layout_links_into_blobs_are_shipped(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (repo / "blobs" / "h1").write_text('{"model": {}}')
    (snapshot / "tokenizer.json").symlink_to(Path("../../blobs/h1"))
    bundle = build_bundle(snapshot)
    assert bundle.names == ("tokenizer.json",)


@pytest.mark.unit
def test_bundle_is_deterministic(tokenizer_dir: Path) -> None:
    assert build_bundle(tokenizer_dir).data == build_bundle(tokenizer_dir).data


@pytest.mark.unit
def test_empty_directory_is_a_failed_precondition(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition):
        build_bundle(tmp_path)


async def _fetch(
    stub,
) -> list[common_pb2.GetTokenizerChunk]:
    return [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]


@pytest.mark.contract
async def test_stream_matches_the_router_contract(stack, tokenizer_dir: Path) -> None:
    chunks = await _fetch(stack.stub)
    data = b"".join(c.data for c in chunks)
    assert len(chunks) >= 2, "the fixture tokenizer is large enough to need several chunks"
    assert all(len(c.data) == CHUNK_SIZE for c in chunks[:-1])
    assert 0 < len(chunks[-1].data) <= CHUNK_SIZE
    assert all(c.sha256 == "" for c in chunks[:-1])
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == sorted(
            ["tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"]
        )
        assert all("/" not in n for n in archive.namelist())
        assert archive.read("tokenizer.json") == (tokenizer_dir / "tokenizer.json").read_bytes()
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in archive.infolist())


@pytest.mark.contract
async def test_fifty_concurrent_callers_share_one_build(stack) -> None:
    results = await asyncio.gather(*(_fetch(stack.stub) for _ in range(50)))
    blobs = {b"".join(c.data for c in chunks) for chunks in results}
    assert len(blobs) == 1
    assert stack.servicer.bundles.builds == 1


@pytest.mark.contract
async def test_unconfigured_path_is_failed_precondition(stack) -> None:
    stack.servicer.tokenizer_path = None
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _fetch(stack.stub)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not configured" in (info.value.details() or "")


@pytest.mark.unit
async def test_failed_build_is_not_cached(tmp_path: Path) -> None:
    cache = TokenizerBundleCache()
    with pytest.raises(FailedPrecondition):
        await cache.get(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    bundle = await cache.get(tmp_path)
    assert bundle.names == ("tokenizer.json",)
    assert cache.builds == 2

"""Hub ids resolve through the Hugging Face cache (offline), and GetTokenizer bundles the same
snapshot when an engine keeps the id as its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from smg_servicer_core import hf_cache
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.testing.hf_cache import add_to_hf_cache
from smg_servicer_core.tokenizer_bundle import TokenizerBundleCache, build_bundle

pytestmark = pytest.mark.unit
REPO_ID = "smg-test/tiny-tokenizer"


@pytest.fixture
def cache(tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    add_to_hf_cache(tokenizer_dir, root, REPO_ID, revision="a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def test_cache_dir_follows_huggingface_hub_order(tmp_path: Path) -> None:
    assert hf_cache.cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hf_cache.cache_dir({"HUGGINGFACE_HUB_CACHE": "/c"}) == Path("/c")
    assert hf_cache.cache_dir({"HF_HOME": "/b"}) == Path("/b/hub")
    assert hf_cache.cache_dir({}) == Path("~/.cache/huggingface/hub").expanduser()


@pytest.mark.parametrize(
    ("value", "is_id"),
    [("org/name", True), ("name-1.5B", True), ("../etc", False), ("a/b/c", False),
     ("/abs/path", False), ("org/..", False), ("", False)],
)  # fmt: skip
def test_repo_id_spelling(value: str, is_id: bool) -> None:
    assert hf_cache.is_repo_id(value) is is_id


def test_a_cached_id_resolves_to_its_snapshot(cache: Path) -> None:
    snapshot = hf_cache.resolve_model(REPO_ID)
    assert snapshot == cache / "models--smg-test--tiny-tokenizer" / "snapshots" / ("a" * 40)
    assert (snapshot / "tokenizer.json").is_symlink()
    assert hf_cache.cached_snapshot(REPO_ID, "a" * 40) == snapshot  # a commit, not a ref
    assert hf_cache.cached_snapshot(REPO_ID, "v2") is None
    assert hf_cache.cached_snapshot(REPO_ID, "../../x") is None


def test_a_directory_wins_over_the_cache(cache: Path, tokenizer_dir: Path) -> None:
    assert hf_cache.resolve_model(str(tokenizer_dir)) == tokenizer_dir


def test_offline_and_not_cached_says_what_to_do(cache: Path) -> None:
    with pytest.raises(ConfigError) as err:
        hf_cache.resolve_model("smg-test/not-there")
    message = str(err.value)
    assert "not in the Hugging Face cache" in message
    assert str(cache) in message
    assert "HF_HUB_OFFLINE" in message


def test_not_an_id_nor_a_directory() -> None:
    with pytest.raises(ConfigError, match="neither a local directory nor a Hugging Face id"):
        hf_cache.resolve_model("/no/such/dir")


async def test_get_tokenizer_bundles_the_snapshot_of_an_id(
    cache: Path, tokenizer_dir: Path
) -> None:
    """vLLM and SGLang keep the id as their tokenizer: the bundle is the cached snapshot's, and
    its symlinks into blobs/ are followed (inside the repository's blobs only)."""
    bundles = TokenizerBundleCache()
    via_id = b"".join(c.data for c in await bundles.stream(REPO_ID))
    assert via_id == build_bundle(tokenizer_dir).data

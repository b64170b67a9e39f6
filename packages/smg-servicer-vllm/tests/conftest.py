from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import vllm_engine_pb2_grpc
from smg_servicer_core.server import ExternalEngine, ServiceBinding
from smg_servicer_core.testing import running_server

METRICS_ENV = "SMG_VLLM_SERVICER_METRICS_PORT"
SESSION = pytest.mark.asyncio(loop_scope="session")


#: The tiny VLM engine's image limit (--limit-mm-per-prompt image=2); the sidecar tests match it.
IMAGE_LIMIT = 2


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the VLM engine may read (its --allowed-local-media-path)."""
    from smg_servicer_core.testing.media import png_image

    folder = tmp_path_factory.mktemp("media")
    (folder / "a.png").write_bytes(png_image(40, 50, seed=1))
    (folder / "b.png").write_bytes(png_image(64, 30, seed=2))
    (folder / "broken.png").write_bytes(b"not an image at all")
    return folder


def images_unserved(model: Path) -> str | None:
    """Why the installed vLLM cannot serve ``model``'s images, or None: its own processor makes
    an image item without pixel rows, and its engine dies on the first image. vLLM 0.27's
    Idefics3 takes its patch count from transformers 5, which counts 0 patches for an image that
    is not split (later releases count at least 1): read from what the processor makes, not from
    the version."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from smg_servicer_vllm import _mm_layouts

    config = EngineArgs(model=str(model), dtype="float32", max_model_len=1024)
    processor = MULTIMODAL_REGISTRY.create_processor(config.create_model_config())
    item, _ = _mm_layouts.sample(processor, "image")
    rows = int(item["pixel_values"].data.shape[0])
    if rows:
        return None
    return f"this vLLM's processor makes 0 pixel rows for {model.name}'s images"


#: The tiny VLM's shape where the installed vLLM serves no image that is not split (vLLM 0.27):
#: every picture resized to 112 pixels and split into four 56-pixel tiles plus a global image.
SPLIT_EDGE = 112


@pytest.fixture(scope="session")
def tiny_vlm() -> Path:
    """The tiny VLM these tests' engines serve: the shared one (no image splitting), or, where
    the installed vLLM cannot serve its images (:func:`images_unserved`), the same model with
    image splitting on (:data:`SPLIT_EDGE`), which every release serves. Fails if neither is."""
    from smg_it.paths import model_cache
    from smg_servicer_core.testing.tiny_vlm import TinyVlmSpec, cached_tiny_vlm

    model = cached_tiny_vlm(model_cache())
    if images_unserved(model) is None:
        return model
    split = cached_tiny_vlm(model_cache(), TinyVlmSpec(split_edge=SPLIT_EDGE))
    if (why := images_unserved(split)) is not None:
        pytest.fail(why)
    return split


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vlm_llm(tiny_vlm: Path, media_dir: Path) -> AsyncIterator[Any]:
    """One real vLLM CPU engine of the tiny VLM, shared by the multimodal modules."""
    llm = build_llm(
        tiny_vlm,
        kv_cache_memory_bytes=64 << 20,
        limit_mm_per_prompt={"image": IMAGE_LIMIT},
        allowed_local_media_path=str(media_dir),
        allowed_media_domains=["127.0.0.1"],
    )
    yield llm
    llm.shutdown()


def build_llm(model: Path, **overrides: Any) -> Any:
    """A real vLLM CPU engine for the float32 tiny Llama; ``overrides`` are AsyncEngineArgs."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args: dict[str, Any] = {
        "model": str(model),
        "dtype": "float32",
        "max_model_len": 1024,
        "enforce_eager": True,
        "kv_cache_memory_bytes": 128 << 20,
        "seed": 0,
    }
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**(args | overrides)))


@pytest.fixture(scope="session")
def make_llm() -> Any:
    return build_llm


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def async_llm(tiny_model: Path) -> AsyncIterator[Any]:
    """One real vLLM CPU engine for the whole session."""
    from vllm.config import StructuredOutputsConfig

    # A random model fills free JSON whitespace forever; the engine option (the same as
    # --structured-outputs-config.disable_any_whitespace) keeps constrained output tight.
    llm = build_llm(
        tiny_model,
        structured_outputs_config=StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True
        ),
    )
    yield llm
    llm.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def embed_llm(tiny_model: Path) -> AsyncIterator[Any]:
    """The same tiny Llama run as an embedding model (vLLM's pooling runner)."""
    llm = build_llm(
        tiny_model,
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        runner="pooling",
        convert="embed",
    )
    yield llm
    llm.shutdown()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_stack(async_llm: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with _serving(async_llm) as stack:
        yield stack


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def embed_stack(embed_llm: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with _serving(embed_llm) as stack:
        yield stack


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def fake_stack() -> AsyncIterator[tuple[Any, Any]]:
    from smg_servicer_vllm.testing import FakeAsyncLLM

    async with _serving(FakeAsyncLLM(token_delay_s=0.002)) as stack:
        yield stack


@pytest.fixture(scope="session")
def serve_llm() -> Any:
    """``async with serve_llm(llm) as (servicer, stub)``: our servicer over ``llm``."""
    return _serving


@contextlib.asynccontextmanager
async def _serving(llm: Any, mm_settings: Any = None) -> AsyncIterator[tuple[Any, Any]]:
    from smg_grpc_servicer.vllm.servicer import VllmEngineServicer  # the path vLLM imports

    # /metrics through the launcher's path (the environment variable; port 0 picks a free one).
    previous = os.environ.get(METRICS_ENV)
    os.environ[METRICS_ENV] = "0"
    try:
        servicer = VllmEngineServicer(llm, time.time(), mm_settings)
    finally:
        if previous is None:
            del os.environ[METRICS_ENV]
        else:
            os.environ[METRICS_ENV] = previous

    def register(server: Any) -> None:
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)

    binding = ServiceBinding("vllm.grpc.engine.VllmEngine", register)
    try:
        async with running_server([binding], HealthFrame("unused"), ExternalEngine()) as server:
            yield servicer, vllm_engine_pb2_grpc.VllmEngineStub(server.channel)
    finally:
        await servicer.multimodal.aclose()
        if servicer.metrics_server is not None:
            servicer.metrics_server.close()


# One media model's engine and workers (the video and audio modules define ``media_model`` and
# ``media_limits``, the engine's --limit-mm-per-prompt) ------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def media_llm(media_model: Path, media_limits: dict[str, int]) -> AsyncIterator[Any]:
    llm = build_llm(media_model, kv_cache_memory_bytes=64 << 20, limit_mm_per_prompt=media_limits)
    yield llm
    llm.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def media_worker(media_llm: Any) -> AsyncIterator[Any]:
    """A worker processing media refs in process (tensors too): its stub."""
    from smg_servicer_vllm.mm_settings import MmSettings

    async with _serving(media_llm, MmSettings(processor="inprocess", source="flag")) as stack:
        yield stack[1]


@pytest.fixture(scope="module")
def media_redis() -> Iterator[Any]:
    from smg_servicer_core.testing.redis_server import RedisServer

    with RedisServer(user="smg-mm", password="m3dia-pa55") as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def media_via_sidecar(
    media_llm: Any,
    media_model: Path,
    media_limits: dict[str, int],
    media_redis: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Any]:
    """A worker whose media refs the Redis sidecar (a real process) processes: its stub."""
    from smg_servicer_vllm.mm_settings import MmSettings
    from smg_servicer_vllm.testing.sidecar import SidecarProcess, sidecar_args

    log = tmp_path_factory.mktemp("media-sidecar") / "sidecar.log"
    limit = json.dumps(media_limits)
    sidecar = SidecarProcess(media_model, media_redis.url, *sidecar_args(limit), log_path=log)
    sidecar.start()
    try:
        settings = MmSettings(processor="redis", redis_url=media_redis.url, source="flag")
        async with _serving(media_llm, settings) as stack:
            yield stack[1]
    finally:
        sidecar.kill()

"""``<engine>_router``: one worker of each engine behind the real router, per module that asks,
both tracing to the session's OTLP collector (``otlp_receiver``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from smg_it.harness import WORKERS, Router, Worker, deployment, free_port
from smg_servicer_core.testing.otlp import OtlpReceiver


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """One OTLP trace collector for the session, on loopback: every deployment's router and
    worker send their spans to it."""
    with OtlpReceiver() as receiver:
        yield receiver


def _deployed(engine: str) -> Callable[..., Iterator[tuple[Worker, Router]]]:
    @pytest.fixture(scope="module", name=f"{engine}_router")
    def deployed(tiny_model: Path, otlp_receiver: OtlpReceiver) -> Iterator[tuple[Worker, Router]]:
        with deployment(engine, tiny_model, traces=otlp_receiver.endpoint) as pair:
            yield pair

    return deployed


mlx_router, vllm_router, sglang_router, tokenspeed_router = map(_deployed, WORKERS)


@pytest.fixture(scope="session")
def vlm_media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the shared VLM worker may read (its ``--allowed-local-media-path``)."""
    from smg_servicer_core.testing.media import png_image

    folder = tmp_path_factory.mktemp("router-media")
    (folder / "a.png").write_bytes(png_image(40, 50, seed=1))
    return folder


@pytest.fixture(scope="session")
def vlm_worker(tiny_vlm: Path, vlm_media_dir: Path) -> Iterator[Worker]:
    """One vLLM worker of the tiny VLM for the session, launched by vLLM's own gRPC launcher
    (``--mm-processor inprocess``, two images a prompt): the router image tests and the
    reliability suite's tensor fuzz share it."""
    extra = (
        "--mm-processor",
        "inprocess",
        "--allowed-local-media-path",
        str(vlm_media_dir),
        "--limit-mm-per-prompt",
        '{"image": 2}',
    )
    with WORKERS["vllm"](tiny_vlm, free_port(), *extra) as worker:
        yield worker

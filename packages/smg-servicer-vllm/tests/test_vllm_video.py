"""Video on vLLM 0.32 through the servicer's in-process media path, without an engine (issue #45):
a generated 12-frame clip (OpenCV, mp4v) as a media ref is fetched by vLLM's connector, decoded by
OpenCV and processed by the tiny LLaVA-NeXT-Video's processor through vLLM's renderer
(``smg_it.video_render``, in a process with the functional torchvision shim). Every frame fills
its 16 positions; the frame cap samples the clip down to 4 frames (64 positions); a clip over the
byte cap is refused before any fetch. Not here (the README says so): the clip through an engine,
as router-preprocessed tensors, or through the Redis sidecar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import smg_it
from smg_it.paths import model_cache
from smg_it.video_render import CAP, FRAMES, SHIM, clip
from smg_servicer_core.config import environment
from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing.media import data_url
from smg_servicer_core.testing.tiny_video_vlm import TinyVideoVlmSpec, cached_tiny_video_vlm
from smg_servicer_vllm.mm import media_items
from smg_servicer_vllm.mm_settings import MmSettings

pytestmark = pytest.mark.engine
PER_FRAME = TinyVideoVlmSpec().embeddings_per_frame


@pytest.fixture(scope="module")
def rendered() -> dict[str, int]:
    model = cached_tiny_video_vlm(model_cache())
    out = Path(tempfile.mkstemp(prefix="smg-video-", suffix=".json")[1])
    kit = str(Path(smg_it.__file__).parent.parent)
    path = os.pathsep.join(p for p in (str(SHIM), kit, environment().get("PYTHONPATH", "")) if p)
    subprocess.run(
        [sys.executable, "-m", "smg_it.video_render", str(model), str(out)],
        check=True,
        env={**environment(), "PYTHONPATH": path},
        timeout=300,
    )
    return json.loads(out.read_text())


def test_every_frame_fills_its_positions_and_the_cap_samples_the_clip_down(
    rendered: dict[str, int],
) -> None:
    assert PER_FRAME == 16
    assert rendered == {"uncapped": FRAMES * PER_FRAME, "capped": CAP * PER_FRAME}


def test_a_clip_over_the_byte_cap_is_refused_before_any_fetch() -> None:
    url = data_url(clip(), "video/mp4")
    request = pb.GenerateRequest(request_id="v", tokenized=pb.TokenizedInput(input_ids=[1, 7, 2]))
    request.media_refs.items.add(modality=3, url=url)  # 3: video (mm.MODALITY_NAMES)
    settings = MmSettings(processor="inprocess", max_item_bytes=len(url) // 2)
    with pytest.raises(InvalidRequest, match=r"over the \d+-byte limit"):
        media_items(request, settings, limits={"video": 1}, schemes=("data",), anchors={"video": 7})
    big = MmSettings(processor="inprocess", max_item_bytes=len(url) * 2)
    items = media_items(request, big, limits={"video": 1}, schemes=("data",), anchors={"video": 7})
    assert [item.modality for item in items] == ["video"]

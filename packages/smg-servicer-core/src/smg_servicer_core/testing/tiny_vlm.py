"""A tiny random Idefics3 vision-language model, written offline and deterministic for a seed.

Idefics3 (a SigLIP-like vision tower, pixel shuffle, a Llama text model) is the one vision family
the CPU build of vLLM runs without torchvision; its image processor has a PIL fallback. The shape
is the smallest vLLM's CPU attention accepts (text ``head_dim`` 32). One 56-pixel image becomes
14-pixel patches (16), pixel-shuffled by 2 to ``image_seq_len`` 4 embeddings, and the processor
expands one ``<image>`` anchor to 7 positions::

    <fake_token_around_image> <global-img> <image> <image> <image> <image> <fake_token_around_image>

Layout: the text model's byte-level BPE (:mod:`.tiny_model`, same seed) plus the 40 special tokens
Idefics3's processor looks up (ids 4096+), ``config.json``, ``generation_config.json``,
``model.safetensors`` (float32), ``preprocessor_config.json`` (no image splitting, longest edge
56), ``processor_config.json`` and a ChatML template that renders an image part as ``<image>``.
Weights come from numpy (normal(0, 0.02); norms 1, biases 0): no torch or transformers needed.

``python -m smg_servicer_core.testing.tiny_vlm OUT_DIR``
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smg_servicer_core.testing.hf_vlm import chatml_template, media_tokenizer
from smg_servicer_core.testing.tiny_model import (
    build_once,
    write_safetensors,
)

#: The tokens Idefics3's processor looks up, in id order from 4096.
SPECIALS: tuple[str, ...] = (
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
)
CHAT_TEMPLATE = chatml_template("<image>")


@dataclass(frozen=True)
class TinyVlmSpec:
    seed: int = 0
    vocab: int = 4160  # the BPE's 4096 + the 40 specials, padded to a multiple of 64
    hidden: int = 64
    layers: int = 2
    heads: int = 2  # head_dim 32: vLLM's CPU attention takes 32, 64, 80, 96, 112, 128, ...
    kv_heads: int = 1
    vision_hidden: int = 32
    vision_heads: int = 2
    image_size: int = 56
    patch: int = 14
    scale_factor: int = 2
    #: 0: no image splitting (one 56-pixel image per picture). Else every picture is resized to
    #: this longest edge (a multiple of ``image_size``) and split into ``image_size`` tiles plus
    #: a global image, as the real Idefics3 checkpoints do: the shape vLLM 0.27 needs, whose
    #: Idefics3 counts 0 patches for an image that is not split.
    split_edge: int = 0

    @property
    def image_seq_len(self) -> int:
        return (self.image_size // self.patch) ** 2 // self.scale_factor**2

    def fingerprint(self) -> str:
        fields = asdict(self)
        if not self.split_edge:  # the name the model had before splitting was a choice
            del fields["split_edge"]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _tokenizer(out: Path, spec: TinyVlmSpec) -> dict[str, int]:
    ids = media_tokenizer(out, spec.seed, SPECIALS, CHAT_TEMPLATE)
    if max(ids.values()) >= spec.vocab or len(set(ids.values())) != len(SPECIALS):
        raise RuntimeError("the special tokens do not fit the vocabulary")
    return ids


def _weights(spec: TinyVlmSpec) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    tensors: dict[str, Any] = {}

    def normal(name: str, *shape: int) -> None:
        tensors[name] = rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    def ones(name: str, n: int) -> None:
        tensors[name] = np.ones(n, np.float32)

    def zeros(name: str, n: int) -> None:
        tensors[name] = np.zeros(n, np.float32)

    h, v, head_dim = spec.hidden, spec.vision_hidden, spec.hidden // spec.heads
    normal("lm_head.weight", spec.vocab, h)
    normal("model.connector.modality_projection.proj.weight", h, v * spec.scale_factor**2)
    text = "model.text_model."
    normal(text + "embed_tokens.weight", spec.vocab, h)
    for layer in range(spec.layers):
        p = f"{text}layers.{layer}."
        ones(p + "input_layernorm.weight", h)
        ones(p + "post_attention_layernorm.weight", h)
        normal(p + "mlp.gate_proj.weight", 2 * h, h)
        normal(p + "mlp.up_proj.weight", 2 * h, h)
        normal(p + "mlp.down_proj.weight", h, 2 * h)
        normal(p + "self_attn.q_proj.weight", spec.heads * head_dim, h)
        normal(p + "self_attn.k_proj.weight", spec.kv_heads * head_dim, h)
        normal(p + "self_attn.v_proj.weight", spec.kv_heads * head_dim, h)
        normal(p + "self_attn.o_proj.weight", h, spec.heads * head_dim)
    ones(text + "norm.weight", h)
    vision = "model.vision_model."
    zeros(vision + "embeddings.patch_embedding.bias", v)
    normal(vision + "embeddings.patch_embedding.weight", v, 3, spec.patch, spec.patch)
    normal(vision + "embeddings.position_embedding.weight", (spec.image_size // spec.patch) ** 2, v)
    p = vision + "encoder.layers.0."
    for norm in ("layer_norm1", "layer_norm2"):
        ones(p + norm + ".weight", v)
        zeros(p + norm + ".bias", v)
    normal(p + "mlp.fc1.weight", 2 * v, v)
    zeros(p + "mlp.fc1.bias", 2 * v)
    normal(p + "mlp.fc2.weight", v, 2 * v)
    zeros(p + "mlp.fc2.bias", v)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        normal(p + f"self_attn.{proj}.weight", v, v)
        zeros(p + f"self_attn.{proj}.bias", v)
    ones(vision + "post_layernorm.weight", v)
    zeros(vision + "post_layernorm.bias", v)
    return tensors


def _config(spec: TinyVlmSpec, ids: dict[str, int]) -> dict[str, Any]:
    text = {
        "model_type": "llama",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": 2 * spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "tie_word_embeddings": False,
        "use_cache": True,
    }
    vision = {
        "model_type": "idefics3_vision",
        "hidden_size": spec.vision_hidden,
        "intermediate_size": 2 * spec.vision_hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": spec.vision_heads,
        "num_channels": 3,
        "image_size": spec.image_size,
        "patch_size": spec.patch,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "attention_dropout": 0.0,
    }
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "dtype": "float32",
        "torch_dtype": "float32",
        "image_token_id": ids["<image>"],
        "scale_factor": spec.scale_factor,
        "pad_token_id": 3,
        "eos_token_id": [2, 0],
        "tie_word_embeddings": False,
        "use_cache": True,
        "text_config": text,
        "vision_config": vision,
    }


def _processor_files(out: Path, spec: TinyVlmSpec) -> None:
    if spec.split_edge % spec.image_size:
        raise ValueError(f"split_edge {spec.split_edge} is not a multiple of {spec.image_size}")
    edge = {"longest_edge": spec.image_size}
    _dump(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Idefics3ImageProcessor",
            "do_convert_rgb": True,
            "do_image_splitting": bool(spec.split_edge),
            "do_normalize": True,
            "do_pad": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "max_image_size": edge,
            "size": {"longest_edge": spec.split_edge} if spec.split_edge else edge,
            "resample": 1,
            "rescale_factor": 1 / 255,
        },
    )
    _dump(
        out / "processor_config.json",
        {"processor_class": "Idefics3Processor", "image_seq_len": spec.image_seq_len},
    )


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def make_tiny_vlm(out_dir: str | Path, spec: TinyVlmSpec | None = None) -> Path:
    """Write the model to ``out_dir`` (created) and return it."""
    spec = spec or TinyVlmSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(out, spec)
    _dump(out / "config.json", _config(spec, ids))
    _dump(
        out / "generation_config.json",
        {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 3, "do_sample": False},
    )
    write_safetensors(out / "model.safetensors", _weights(spec), "float32")
    _processor_files(out, spec)
    return out


def cached_tiny_vlm(cache_root: str | Path, spec: TinyVlmSpec | None = None) -> Path:
    """The model for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyVlmSpec()
    final = Path(cache_root) / f"tiny-idefics3-float32-{spec.fingerprint()}"
    return build_once(final, lambda staging: make_tiny_vlm(staging, spec))


def image_token_ids(model_dir: str | Path) -> dict[str, int]:
    """The media special tokens' ids of a model written here."""
    config = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    return {t["content"]: int(t["id"]) for t in config["added_tokens"] if t["content"] in SPECIALS}


@dataclass(frozen=True)
class AnchorLayout:
    """What one ``<image>`` anchor becomes for one picture: the prompt positions it expands to
    and the embeddings the encoder makes (tiles x ``image_seq_len``)."""

    positions: int
    embeddings: int


def anchor_layout(model_dir: str | Path, width: int, height: int) -> AnchorLayout:
    """Idefics3's rule for a ``width`` x ``height`` picture and a model written here, read from
    its processor files and counted with its tokenizer: an oracle independent of vLLM.

    Unsplit: ``<fake><global-img><image>*n<fake>``. Split: the picture is scaled to the
    ``size`` edge (its other edge even), each edge rounded up to whole ``max_image_size`` tiles,
    and every tile is ``<fake><row_i_col_j><image>*n`` (a newline after each row), then a
    newline and the unsplit form for the global image."""
    from tokenizers import Tokenizer

    model = Path(model_dir)
    pre = json.loads((model / "preprocessor_config.json").read_text())
    seq = int(json.loads((model / "processor_config.json").read_text())["image_seq_len"])
    rows = cols = 0
    if pre["do_image_splitting"]:
        edge, tile = pre["size"]["longest_edge"], pre["max_image_size"]["longest_edge"]
        if width >= height:
            width, height = edge, int(edge / (width / height))
            height += height % 2
        else:
            width, height = int(edge * (width / height)), edge
            width += width % 2
        if height > tile or width > tile:
            rows, cols = -(-height // tile), -(-width // tile)
    fake, image = "<fake_token_around_image>", "<image>" * seq
    text = "".join(
        "".join(f"{fake}<row_{r}_col_{c}>{image}" for c in range(1, cols + 1)) + "\n"
        for r in range(1, rows + 1)
    )
    text += ("\n" if rows else "") + f"{fake}<global-img>{image}{fake}"
    positions = len(Tokenizer.from_file(str(model / "tokenizer.json")).encode(text).ids)
    return AnchorLayout(positions, seq * (rows * cols + 1))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m smg_servicer_core.testing.tiny_vlm OUT_DIR", file=sys.stderr)
        return 2
    out = make_tiny_vlm(args[0])
    print(json.dumps({"out_dir": str(out), **asdict(TinyVlmSpec())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

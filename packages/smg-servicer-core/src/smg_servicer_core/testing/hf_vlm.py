"""What the tiny vision models share (:mod:`.tiny_vlm`, :mod:`.tiny_gemma3`,
:mod:`.tiny_video_vlm`): the text model's tokenizer with the model's media tokens added, a ChatML
template that renders an image part as the model's anchor, and (the two built with transformers)
transformers' saved weights renamed to the vision-tower names the released checkpoints use.
Needs tokenizers; :func:`save_weights` needs torch, transformers and safetensors."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from smg_servicer_core.testing.tiny_model import TinyModelSpec, make_tiny_model


def untyped(name: str) -> Any:
    """An untyped import (torch, transformers and safetensors ship partial types)."""
    return importlib.import_module(name)


def chatml_template(image_anchor: str) -> str:
    """ChatML whose image parts (``image``, ``image_url``) render as ``image_anchor``."""
    return (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for content in message['content'] %}"
        "{% if content['type'] == 'image' or content['type'] == 'image_url' "
        f"or 'image' in content %}}{image_anchor}"
        "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def media_tokenizer(
    out: Path,
    seed: int,
    specials: tuple[str, ...],
    chat_template: str,
    extra_special_tokens: dict[str, str] | None = None,
) -> dict[str, int]:
    """The tiny text model's tokenizer (same seed) with ``specials`` added and ``chat_template``,
    written to ``out``; the specials' ids."""
    from tokenizers import AddedToken, Tokenizer

    text_dir = out / ".text-tokenizer"
    make_tiny_model(text_dir, TinyModelSpec(seed=seed))
    try:
        tokenizer = Tokenizer.from_file(str(text_dir / "tokenizer.json"))
        tokenizer.add_special_tokens(  # pyright: ignore[reportUnknownMemberType]
            [AddedToken(s, special=True, normalized=False) for s in specials]
        )
        tokenizer.save(str(out / "tokenizer.json"))
        ids: dict[str, int] = {}
        for name in specials:
            token = tokenizer.token_to_id(name)
            if token is None:
                raise RuntimeError(f"special token {name} was not added")
            ids[name] = token
        config = json.loads((text_dir / "tokenizer_config.json").read_text())
        config.pop("added_tokens_decoder", None)
        config["chat_template"] = chat_template
        config["extra_special_tokens"] = extra_special_tokens or {}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        shutil.copy(text_dir / "special_tokens_map.json", out / "special_tokens_map.json")
    finally:
        shutil.rmtree(text_dir, ignore_errors=True)
    (out / "chat_template.jinja").write_text(chat_template)
    return ids


def save_weights(
    model: Any,
    out: Path,
    redraw: dict[str, float],
    seed: int,
    renames: tuple[tuple[str, str], ...] = (),
) -> None:
    """``model`` (transformers) saved to ``out`` as float32 safetensors, its vision tower under
    ``vision_tower.vision_model.`` (transformers 5 drops ``vision_model.``; SGLang's and vLLM's
    loaders want it), each name starting with a ``renames`` prefix given the other prefix, each
    tensor named in ``redraw`` drawn again normal(0, std) (seeded)."""
    torch, safetensors = untyped("torch"), untyped("safetensors.torch")
    model.to(torch.float32).save_pretrained(str(out))
    weights = out / "model.safetensors"
    tensors = {
        (
            name.replace("vision_tower.", "vision_tower.vision_model.", 1)
            if name.startswith("vision_tower.") and ".vision_model." not in name
            else name
        ): value.contiguous()
        for name, value in safetensors.load_file(str(weights)).items()
    }
    for old, new in renames:
        tensors = {
            (new + name.removeprefix(old) if name.startswith(old) else name): value
            for name, value in tensors.items()
        }
    draw = torch.Generator().manual_seed(seed)
    for name, std in redraw.items():
        tensors[name] = torch.randn(tensors[name].shape, generator=draw) * std
    safetensors.save_file(tensors, str(weights), metadata={"format": "pt"})


def dump(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON."""
    path.write_text(json.dumps(obj, indent=2) + "\n")


def text_config(model_type: str, vocab: int, hidden: int) -> dict[str, Any]:
    """The two-layer text model of the tiny media models (``llama`` or ``qwen2``)."""
    return {
        "model_type": model_type, "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": hidden // 2, "hidden_act": "silu",
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 0,
        "eos_token_id": 2, "pad_token_id": 3, "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    }  # fmt: skip


def redrawn(out: Path, model_class: str, seed: int, std: float) -> Any:
    """transformers' ``model_class`` for the config in ``out``, initialised under
    ``torch.manual_seed(seed)``, every matrix redrawn normal(0, ``std``) so that the media move
    the answer."""
    torch, transformers = untyped("torch"), untyped("transformers")
    config = transformers.AutoConfig.from_pretrained(str(out))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, std)
    return model


def main_of(module: str, make: Any, argv: list[str] | None) -> int:
    """``python -m smg_servicer_core.testing.MODULE OUT_DIR``: ``make(OUT_DIR)``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m smg_servicer_core.testing.{module} OUT_DIR", file=sys.stderr)
        return 2
    print(make(args[0]))
    return 0

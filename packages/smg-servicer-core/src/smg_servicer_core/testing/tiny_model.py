"""A tiny random Llama or Qwen2 model plus tokenizer, written offline and deterministic for a seed.

Layout (loadable by transformers, mlx-lm, vLLM and SGLang)::

    config.json  generation_config.json  model.safetensors
    tokenizer.json  tokenizer_config.json  special_tokens_map.json  chat_template.jinja

The tokenizer is a byte-level BPE trained on a corpus generated here from the seed (English
sentences mixed with Zipf-distributed pseudo-words). Specials: ``<|endoftext|>``=0,
``<|im_start|>``=1, ``<|im_end|>``=2 (EOS), ``<|pad|>``=3; ``eos_token_id`` is ``[2, 0]``. The
chat template is ChatML. Weights are float32 by default because token-exact comparisons across
engines need it (bf16 argmax flips on rounding noise with a random model).

``python -m smg_servicer_core.testing.tiny_model OUT_DIR [--arch qwen2] [--dtype bfloat16]
[--hidden 512 --layers 4 --heads 8 --kv-heads 4 --intermediate 1536]`` (the shape flags make the
larger benchmark models; the defaults are the test model)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SEED_TEXT = (
    "The router sends each request to a worker and the worker streams tokens back. "
    "Hello, world! How are you today? Please write a short story about the sea. "
    "What is the capital of France? Paris is the capital of France. "
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 100 and 3.14 appear in text; lists: one, two, three. "
    'def main():\n    print("hi")\n    return 0\n{"key": [1, 2, 3]}\n'
)

Arch = Literal["llama", "qwen2"]
DType = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class TinyModelSpec:
    arch: Arch = "llama"
    dtype: DType = "float32"
    seed: int = 0
    vocab: int = 4096
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    max_positions: int = 2048
    corpus_sentences: int = 20000

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _corpus(seed: int, sentences: int) -> list[str]:
    rng = random.Random(seed)
    onsets = [*"bcdfghjklmnprstvwz", "ch", "sh", "th", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    syllables = [c + v for c in onsets for v in vowels]
    words: set[str] = set()
    while len(words) < 5000:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
    lexicon = sorted(words)
    rng.shuffle(lexicon)
    english = sorted(set(_SEED_TEXT.split()))
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    lines = [_SEED_TEXT] * 40
    for _ in range(sentences):
        picked = rng.choices(lexicon, weights=weights, k=rng.randint(3, 12))
        mixed = [rng.choice(english) if rng.random() < 0.25 else w for w in picked]
        lines.append(" ".join(mixed).capitalize() + rng.choice(".?!,;:"))
    return lines


def _write_tokenizer(out: Path, spec: TinyModelSpec) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab,
        min_frequency=1,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec.seed, spec.corpus_sentences), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    ids: dict[str, int] = {}
    for name in SPECIALS:
        token_id = tokenizer.token_to_id(name)
        if token_id is None:
            raise RuntimeError(f"special token {name} missing from the trained vocabulary")
        ids[name] = token_id
    added = {
        str(ids[name]): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for name in SPECIALS
    }
    _dump(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|pad|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": spec.max_positions,
            "chat_template": CHATML_TEMPLATE,
            "added_tokens_decoder": added,
        },
    )
    _dump(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|pad|>"})
    (out / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    return {"vocab": tokenizer.get_vocab_size(), **ids}


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _weights(spec: TinyModelSpec, vocab: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    head_dim = spec.hidden // spec.heads

    def normal(*shape: int) -> Any:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, np.float32)

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, spec.hidden)}
    for layer in range(spec.layers):
        p = f"model.layers.{layer}."
        tensors[p + "self_attn.q_proj.weight"] = normal(spec.heads * head_dim, spec.hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(spec.kv_heads * head_dim, spec.hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(spec.kv_heads * head_dim, spec.hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(spec.hidden, spec.heads * head_dim)
        if spec.arch == "qwen2":
            for proj, heads in (("q", spec.heads), ("k", spec.kv_heads), ("v", spec.kv_heads)):
                tensors[p + f"self_attn.{proj}_proj.bias"] = np.zeros(heads * head_dim, np.float32)
        tensors[p + "mlp.gate_proj.weight"] = normal(spec.intermediate, spec.hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(spec.intermediate, spec.hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(spec.hidden, spec.intermediate)
        tensors[p + "input_layernorm.weight"] = ones(spec.hidden)
        tensors[p + "post_attention_layernorm.weight"] = ones(spec.hidden)
    tensors["model.norm.weight"] = ones(spec.hidden)
    tensors["lm_head.weight"] = normal(vocab, spec.hidden)
    return tensors


def _encode(array: Any, dtype: DType) -> tuple[str, bytes]:
    import numpy as np

    data = np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "float32":
        return "F32", data.tobytes()
    if dtype == "float16":
        return "F16", data.astype(np.float16).tobytes()
    bits = data.view(np.uint32)  # bfloat16: round to nearest even, keep the top 16 bits
    return "BF16", ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def write_safetensors(path: Path, tensors: dict[str, Any], dtype: DType) -> None:
    """The safetensors format: u64 header length, JSON header, raw little-endian data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        kind, blob = _encode(tensors[name], dtype)
        header[name] = {
            "dtype": kind,
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for blob in blobs:
            fh.write(blob)


def _config(spec: TinyModelSpec, ids: dict[str, int]) -> dict[str, Any]:
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM" if spec.arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": spec.arch,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "vocab_size": ids["vocab"],
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "attention_bias": spec.arch == "qwen2",
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": eos,
        "pad_token_id": ids["<|pad|>"],
        "torch_dtype": spec.dtype,
        "dtype": spec.dtype,
    }
    if spec.arch == "qwen2":
        config |= {
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": spec.layers,
        }
    return config


def make_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write the model to ``out_dir`` (created) and return it."""
    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = _write_tokenizer(out, spec)
    config = _config(spec, ids)
    _dump(out / "config.json", config)
    _dump(
        out / "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": config["pad_token_id"],
            "do_sample": False,
        },
    )
    write_safetensors(out / "model.safetensors", _weights(spec, ids["vocab"]), spec.dtype)
    return out


def cached_tiny_model(cache_root: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """The model for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyModelSpec()
    final = Path(cache_root) / f"tiny-{spec.arch}-{spec.dtype}-{spec.fingerprint()}"
    return build_once(final, lambda staging: make_tiny_model(staging, spec))


def build_once(final: Path, make: Callable[[Path], object]) -> Path:
    """``final``, written by ``make(staging)`` into a sibling folder and renamed into place unless
    it already holds a ``model.safetensors`` (concurrent builders: the first rename wins)."""
    if (final / "model.safetensors").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.{random.getrandbits(32):08x}.tmp"
    make(staging)
    try:
        staging.rename(final)
    except OSError:  # another process won the race; theirs is identical
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    for spec_field in fields(TinyModelSpec):  # the numeric fields: --seed, --vocab, --hidden, ...
        if spec_field.name not in {"arch", "dtype"}:
            flag = "--" + spec_field.name.replace("_", "-")
            parser.add_argument(flag, type=int, default=spec_field.default)
    args = parser.parse_args(argv)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error("--hidden must divide by --heads, and --heads by --kv-heads")
    spec = TinyModelSpec(**{f.name: getattr(args, f.name) for f in fields(TinyModelSpec)})
    out = make_tiny_model(args.out_dir, spec)
    print(json.dumps({"out_dir": str(out), **asdict(spec)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

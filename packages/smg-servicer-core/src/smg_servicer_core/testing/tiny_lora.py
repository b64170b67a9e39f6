"""A tiny LoRA adapter for the tiny model, in PEFT's on-disk format (no peft needed).

PEFT writes an adapter as a folder with ``adapter_config.json`` and ``adapter_model.safetensors``
whose tensors are named ``base_model.model.<module>.lora_A.weight`` (``r x in``) and
``...lora_B.weight`` (``out x r``); the update of a target module is ``B @ A * alpha / r``. The
weights here are large next to the tiny model's (N(0, 0.02)), so an adapter changes greedy ids,
and two adapters made with different seeds differ from each other.

``python -m smg_servicer_core.testing.tiny_lora OUT [--seed N]`` writes one for the default tiny
model.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smg_servicer_core.testing.tiny_model import (
    TinyModelSpec,
    build_once,
    write_safetensors,
)

#: The files an adapter folder holds.
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class TinyLoraSpec:
    seed: int = 1
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    #: Standard deviation of A and B: big enough that the adapter moves greedy ids.
    scale: float = 0.3

    def name(self) -> str:
        return f"lora-r{self.rank}-s{self.seed}-{'-'.join(self.targets)}"


def _module(model: TinyModelSpec, target: str) -> tuple[str, int, int]:
    """(block, in features, out features) of one projection of the tiny model."""
    head_dim = model.hidden // model.heads
    shapes = {
        "q_proj": ("self_attn", model.hidden, model.heads * head_dim),
        "k_proj": ("self_attn", model.hidden, model.kv_heads * head_dim),
        "v_proj": ("self_attn", model.hidden, model.kv_heads * head_dim),
        "o_proj": ("self_attn", model.heads * head_dim, model.hidden),
        "gate_proj": ("mlp", model.hidden, model.intermediate),
        "up_proj": ("mlp", model.hidden, model.intermediate),
        "down_proj": ("mlp", model.intermediate, model.hidden),
    }
    return shapes[target]


def adapter_config(spec: TinyLoraSpec, base_model: str) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(spec.targets),
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }


def make_tiny_lora(
    out_dir: str | Path,
    spec: TinyLoraSpec | None = None,
    model: TinyModelSpec | None = None,
    base_model: str = "tiny",
) -> Path:
    """Write the adapter to ``out_dir`` (created) and return it."""
    import numpy as np  # noqa: PLC0415 - the test kit imports numpy only where it builds

    spec = spec or TinyLoraSpec()
    model = model or TinyModelSpec()
    rng = np.random.default_rng(spec.seed)
    tensors: dict[str, Any] = {}
    for layer in range(model.layers):
        for target in spec.targets:
            block, fan_in, fan_out = _module(model, target)
            prefix = f"base_model.model.model.layers.{layer}.{block}.{target}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0.0, spec.scale, (spec.rank, fan_in))
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0.0, spec.scale, (fan_out, spec.rank))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(adapter_config(spec, base_model), indent=2) + "\n")
    write_safetensors(out / WEIGHTS, tensors, "float32")
    return out


def cached_tiny_lora(
    cache_root: str | Path, spec: TinyLoraSpec | None = None, model: TinyModelSpec | None = None
) -> Path:
    """The adapter for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyLoraSpec()
    model = model or TinyModelSpec()
    final = Path(cache_root) / f"{spec.name()}-for-{model.fingerprint()}"
    if (final / WEIGHTS).is_file():
        return final
    return build_once(final, lambda staging: make_tiny_lora(staging, spec, model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=TinyLoraSpec.seed)
    parser.add_argument("--rank", type=int, default=TinyLoraSpec.rank)
    args = parser.parse_args(argv)
    spec = TinyLoraSpec(seed=args.seed, rank=args.rank)
    print(make_tiny_lora(args.out_dir, spec))
    print(json.dumps(asdict(spec)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Model facts from the model directory's ``config.json``. Pure: no MLX."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smg_servicer_core.errors import ConfigError

CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length")


@dataclass(frozen=True)
class ModelInfo:
    #: The local model directory (a Hub id's cached snapshot).
    path: str
    vocab_size: int
    max_context: int
    model_type: str
    architectures: tuple[str, ...]
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    bos_token_id: int
    #: What ``--model`` said (a directory or a Hub id): ``GetModelInfo.model_path``.
    name: str = ""


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))  # pyright: ignore[reportUnknownVariableType]
    return ()


def read_model_info(model_dir: str | Path, name: str | None = None) -> ModelInfo:
    path = Path(model_dir)
    try:
        config: dict[str, Any] = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path / 'config.json'}: {exc}") from exc
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**text, **config}  # pyright: ignore[reportUnknownArgumentType]
    context = next((int(config[k]) for k in CONTEXT_KEYS if int(config.get(k) or 0) > 0), 0)
    vocab = int(config.get("vocab_size") or 0)
    if vocab <= 0 or context <= 0:
        raise ConfigError(f"{path / 'config.json'} lacks vocab_size or a context length")
    eos = _ids(config.get("eos_token_id"))
    generation = path / "generation_config.json"
    if not eos and generation.is_file():
        eos = _ids(json.loads(generation.read_text()).get("eos_token_id"))
    return ModelInfo(
        path=str(path),
        vocab_size=vocab,
        max_context=context,
        model_type=str(config.get("model_type", "")),
        architectures=tuple(str(a) for a in config.get("architectures") or ()),
        eos_token_ids=eos,
        pad_token_id=int(config.get("pad_token_id") or 0),
        bos_token_id=int(config.get("bos_token_id") or 0),
        name=name or str(path),
    )

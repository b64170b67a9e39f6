from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from smg_servicer_core.testing import TinyModelSpec, make_tiny_model
from smg_servicer_core.testing.tiny_model import main as tiny_model_main
from smg_servicer_core.tokenizer_bundle import build_bundle

HEAVY = ("torch", "vllm", "sglang", "mlx", "mlx_lm", "tokenspeed", "transformers", "numpy")


@pytest.mark.unit
def test_importing_core_and_facade_imports_no_engine() -> None:
    code = (
        "import sys, smg_servicer_core, smg_grpc_servicer, smg_grpc_servicer.vllm, "
        "smg_grpc_servicer.sglang, smg_grpc_servicer.mlx, smg_servicer_core.server, "
        "smg_servicer_core.tokenizer_bundle, smg_servicer_core.registry\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(corpus_sentences=3000)
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), spec)


@pytest.mark.unit
def test_tiny_model_is_deterministic_for_a_seed(tiny: Path, tmp_path: Path) -> None:
    again = make_tiny_model(tmp_path / "again", TinyModelSpec(corpus_sentences=3000))
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name
    other = make_tiny_model(tmp_path / "other", TinyModelSpec(corpus_sentences=3000, seed=1))
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


@pytest.mark.unit
def test_tiny_model_files_are_consistent(tiny: Path) -> None:
    from tokenizers import Tokenizer

    config = json.loads((tiny / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    assert [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [
        0,
        1,
        2,
    ]
    assert config["eos_token_id"] == [2, 0]
    raw = (tiny / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    embed = header["model.embed_tokens.weight"]
    assert embed["dtype"] == "F32" and embed["shape"] == [config["vocab_size"], 128]
    assert max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__") == (
        len(raw) - 8 - length
    )
    bundle = build_bundle(tiny)
    assert "model.safetensors" not in bundle.names
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(bundle.names)


@pytest.mark.unit
def test_tiny_model_command_builds_the_shape_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--hidden", "64", "--layers", "3", "--heads", "4", "--kv-heads", "2"]
    out = tmp_path / "m"
    flags += ["--intermediate", "96", "--corpus-sentences", "500"]
    assert tiny_model_main([str(out), *flags]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["hidden"], printed["layers"], printed["intermediate"]) == (64, 3, 96)
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 3)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["intermediate_size"] == 96
    raw = (out / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert header["model.layers.2.mlp.down_proj.weight"]["shape"] == [64, 96]
    assert "model.layers.3.mlp.down_proj.weight" not in header
    with pytest.raises(SystemExit) as refused:
        tiny_model_main([str(tmp_path / "bad"), "--hidden", "66", "--heads", "4"])
    assert refused.value.code == 2
    assert not (tmp_path / "bad").exists()

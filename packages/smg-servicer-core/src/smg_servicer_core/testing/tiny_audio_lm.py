"""A tiny random Qwen2-Audio model (audio in, text out; issue #45), written offline and
deterministic for a seed: a one-layer Whisper-style audio encoder (80 mel bins, 30-second windows:
one second of 16 kHz audio makes 25 embeddings), its projector and a tiny Qwen2 text model. vLLM
0.32's CPU build serves it as it is (no torchvision: Whisper's feature extractor runs on torch).

Layout: the text model's byte-level BPE (:mod:`.tiny_model`, same seed) plus ``<|AUDIO|>``,
``<|audio_bos|>`` and ``<|audio_eos|>``, ``config.json``, ``model.safetensors`` (float32), the
feature extractor's and the processor's configs, and a ChatML template that renders an audio part
as ``<|audio_bos|><|AUDIO|><|audio_eos|>``. The weights are transformers' initialisation under
``torch.manual_seed(seed)``, every matrix redrawn normal(0, std) so that the audio moves the
answer: needs torch and transformers.

``python -m smg_servicer_core.testing.tiny_audio_lm OUT_DIR``
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import wave
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
    untyped,
)
from smg_servicer_core.testing.tiny_model import build_once

AUDIO, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
#: What one audio part of a chat renders as (the model's own prompt format).
AUDIO_ANCHOR = AUDIO_BOS + AUDIO + AUDIO_EOS
SAMPLE_RATE = 16_000
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] in ('audio', 'audio_url', 'input_audio') %}" + AUDIO_ANCHOR +
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)  # fmt: skip


@dataclass(frozen=True)
class TinyAudioLmSpec:
    seed: int = 0
    vocab: int = 4160
    hidden: int = 64
    std: float = 0.05
    #: The feature extractor's window, in seconds (Whisper pads or cuts every clip to it; vLLM's
    #: Qwen2-Audio takes 30-second windows only: 3000 mel frames).
    window_s: int = 30

    @property
    def embeddings_per_second(self) -> int:
        """Mel frames (100 a second) halved by the encoder's stride, halved again by its pool."""
        return 100 // 4

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _config(spec: TinyAudioLmSpec, ids: dict[str, int]) -> dict[str, Any]:
    text = text_config("qwen2", spec.vocab, spec.hidden)
    audio = {
        "model_type": "qwen2_audio_encoder", "num_mel_bins": 80, "encoder_layers": 1,
        "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "d_model": 32,
        "max_source_positions": 50 * spec.window_s, "activation_function": "gelu",
        "scale_embedding": False,
    }  # fmt: skip
    return {
        "architectures": ["Qwen2AudioForConditionalGeneration"],
        "model_type": "qwen2_audio", "dtype": "float32", "audio_token_index": ids[AUDIO],
        "tie_word_embeddings": False, "text_config": text, "audio_config": audio,
    }  # fmt: skip


def _processor_files(out: Path, spec: TinyAudioLmSpec) -> None:
    samples = SAMPLE_RATE * spec.window_s
    dump(
        out / "preprocessor_config.json",
        {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
         "sampling_rate": SAMPLE_RATE, "hop_length": 160, "chunk_length": spec.window_s,
         "n_fft": 400, "n_samples": samples, "nb_max_frames": samples // 160,
         "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True},
    )  # fmt: skip
    dump(
        out / "processor_config.json",
        {"processor_class": "Qwen2AudioProcessor", "audio_token": AUDIO,
         "audio_bos_token": AUDIO_BOS, "audio_eos_token": AUDIO_EOS},
    )  # fmt: skip


def make_tiny_audio_lm(out_dir: str | Path, spec: TinyAudioLmSpec | None = None) -> Path:
    """Write the model to ``out_dir`` (created) and return it."""
    spec = spec or TinyAudioLmSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = media_tokenizer(out, spec.seed, (AUDIO, AUDIO_BOS, AUDIO_EOS), CHAT_TEMPLATE)
    dump(out / "config.json", _config(spec, ids))
    _processor_files(out, spec)
    model = redrawn(out, "Qwen2AudioForConditionalGeneration", spec.seed, spec.std)
    # transformers 5 saves the text model under language_model.model.model.; vLLM loads the
    # released checkpoints' language_model.model.
    save_weights(
        model, out, {}, spec.seed, (("language_model.model.model.", "language_model.model."),)
    )
    dump(out / "config.json", _config(spec, ids))  # save_pretrained rewrote it
    return out


def cached_tiny_audio_lm(cache_root: str | Path, spec: TinyAudioLmSpec | None = None) -> Path:
    """The model for ``spec`` under ``cache_root``, built once (atomically) and reused."""
    spec = spec or TinyAudioLmSpec()
    final = Path(cache_root) / f"tiny-qwen2-audio-float32-{spec.fingerprint()}"
    return build_once(final, lambda staging: make_tiny_audio_lm(staging, spec))


def wav(samples: Any, rate: int = SAMPLE_RATE) -> bytes:
    """16-bit mono PCM WAV bytes of ``samples`` (floats in [-1, 1]), stdlib ``wave``."""
    np = untyped("numpy")
    pcm = (np.clip(np.asarray(samples, np.float64), -1, 1) * 32767).astype("<i2").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    return main_of("tiny_audio_lm", make_tiny_audio_lm, argv)


if __name__ == "__main__":
    sys.exit(main())

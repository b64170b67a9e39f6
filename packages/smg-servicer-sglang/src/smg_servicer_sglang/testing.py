"""How to start SGLang on a CPU for tests and benchmarks (imports no SGLang).

The SGLang test environment lives in ``.venv-sglang`` at the repository root, built by
``tools/envs/sglang-cpu/install.sh``; :func:`sglang_python` finds it (``SMG_SGLANG_PYTHON``
overrides) and fails loudly with the install hint when it is missing.
"""

from __future__ import annotations

from pathlib import Path

from smg_servicer_core.config import Setting, setting_value

#: SGLang's CPU code paths (``is_cpu()``); without it RotaryEmbedding imports vLLM's CUDA ops.
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}

#: Engine flags for the float32 tiny model on a CPU without AMX (torch-native attention and
#: sampling; no CUDA graphs; a 1,024-token context).
CPU_FLAGS = (
    "--device", "cpu",
    "--dtype", "float32",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--context-length", "1024",
    "--max-total-tokens", "65536",
    "--disable-cuda-graph",
    "--log-level", "warning",
)  # fmt: skip

#: The same settings as keyword arguments of ``sglang.Engine`` (in-process references, benches).
ENGINE_KWARGS: dict[str, object] = {
    "device": "cpu",
    "dtype": "float32",
    "context_length": 1024,
    "attention_backend": "torch_native",
    "sampling_backend": "pytorch",
    "max_total_tokens": 65536,
    "disable_cuda_graph": True,
    "log_level": "error",
}

INSTALL_HINT = "bash tools/envs/sglang-cpu/install.sh"
SGLANG_PYTHON = Setting(
    "sglang_python", str, "", "the SGLang environment's python", env="SMG_SGLANG_PYTHON"
)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[4]


def sglang_python() -> Path:
    """The SGLang test environment's interpreter; RuntimeError with the fix when missing."""
    override = setting_value(SGLANG_PYTHON)
    path = Path(override) if override else repo_root() / ".venv-sglang" / "bin" / "python"
    if not path.exists():
        raise RuntimeError(f"the SGLang test environment is missing ({path}): run {INSTALL_HINT}")
    return path


def serve_command(
    model: Path,
    port: int,
    *extra: str,
    python: Path | None = None,
    mode_flag: str = "--smg-grpc-mode",
) -> list[str]:
    """``sglang serve --smg-grpc-mode`` (SGLang's own launcher, our servicer behind it);
    ``mode_flag="--grpc-mode"`` is the seed's spelling, which SGLang maps to the same mode."""
    exe = (python or sglang_python()).parent / "sglang"
    return [
        str(exe), "serve",
        "--model-path", str(model),
        *CPU_FLAGS,
        mode_flag,
        "--host", "127.0.0.1",
        "--port", str(port),
        *extra,
    ]  # fmt: skip

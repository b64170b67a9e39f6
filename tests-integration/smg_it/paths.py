"""Where things lie in the checkout: the one place the test kit, and every test through it, finds
the repository, its cache and the engine test environments."""

from __future__ import annotations

from pathlib import Path

from smg_servicer_core.config import Setting, setting_value


def _checkout() -> Path:
    """The workspace root above this file (the folder holding ``uv.lock`` and ``packages/``)."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "uv.lock").is_file() and (folder / "packages").is_dir():
            return folder
    raise RuntimeError(f"{__file__} is not inside the smg-servicer checkout")


#: The checkout's root.
REPO = _checkout()
#: What the tests build and keep between runs (models, reliability figures, release venvs).
CACHE = REPO / ".cache"

MODEL_CACHE = Setting(
    "model_cache", str, "", "where the tiny test models are built", env="SMG_MODEL_CACHE"
)


def model_cache() -> Path:
    """``.cache/models`` (``SMG_MODEL_CACHE`` overrides): the tiny text model and VLM, built once
    per machine."""
    return Path(setting_value(MODEL_CACHE) or CACHE / "models").resolve()


SGLANG_PYTHON = Setting(
    "sglang_python", str, "", "the SGLang environment's python", env="SMG_SGLANG_PYTHON"
)
TOKENSPEED_PYTHON = Setting(
    "tokenspeed_python", str, "", "the TokenSpeed environment's python",
    env="SMG_TOKENSPEED_PYTHON",
)  # fmt: skip


def _engine_python(name: str, venv: str, override: str, install: str) -> Path:
    path = Path(override) if override else REPO / venv / "bin" / "python"
    if not path.exists():
        raise RuntimeError(f"the {name} test environment is missing ({path}): run bash {install}")
    return path


def sglang_python() -> Path:
    """The SGLang test environment's interpreter (``.venv-sglang``; ``SMG_SGLANG_PYTHON``
    overrides); RuntimeError with the command that builds it when missing."""
    override = setting_value(SGLANG_PYTHON)
    return _engine_python("SGLang", ".venv-sglang", override, "tools/envs/sglang-cpu/install.sh")


def tokenspeed_python() -> Path:
    """The TokenSpeed test environment's interpreter (``.venv-tokenspeed``;
    ``SMG_TOKENSPEED_PYTHON`` overrides); RuntimeError with the command that builds it when
    missing."""
    override = setting_value(TOKENSPEED_PYTHON)
    script = "tools/envs/tokenspeed-cpu/install.sh"
    return _engine_python("TokenSpeed", ".venv-tokenspeed", override, script)

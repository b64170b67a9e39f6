"""Running TokenSpeed on a CPU for tests (imports no TokenSpeed).

The TokenSpeed test environment lives in ``.venv-tokenspeed`` at the repository root, built by
``tools/envs/tokenspeed-cpu/install.sh``; :func:`tokenspeed_python` finds it
(``SMG_TOKENSPEED_PYTHON`` overrides) and fails loudly with the install hint when it is missing.
:mod:`.scheduler` is the stand-in for TokenSpeed's GPU scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smg_servicer_core.config import Setting, parse_bool, setting_value

INSTALL_HINT = "bash tools/envs/tokenspeed-cpu/install.sh"
TOKENSPEED_PYTHON = Setting(
    "tokenspeed_python", str, "", "the TokenSpeed environment's python",
    env="SMG_TOKENSPEED_PYTHON",
)  # fmt: skip
REAL_SCHEDULER = Setting(
    "real_scheduler", parse_bool, False, "run the tests on TokenSpeed's real (GPU) scheduler",
    env="SMG_TS_REAL_SCHEDULER",
)  # fmt: skip
#: The scheduler stand-in's entry (``SMG_TOKENSPEED_SCHEDULER``).
STANDIN_ENTRY = "smg_servicer_tokenspeed.testing.scheduler:run"
#: TokenSpeed flags for the float32 tiny model on a CPU (``--device`` only takes cuda/npu; on
#: this path nothing touches it).
CPU_FLAGS = ("--max-model-len", "1024", "--log-level", "warning")


def repo_root() -> Path:
    return Path(__file__).resolve().parents[5]


def tokenspeed_python() -> Path:
    """The TokenSpeed test environment's interpreter; RuntimeError with the fix when missing."""
    override = setting_value(TOKENSPEED_PYTHON)
    path = Path(override) if override else repo_root() / ".venv-tokenspeed" / "bin" / "python"
    if not path.exists():
        raise RuntimeError(
            f"the TokenSpeed test environment is missing ({path}): run {INSTALL_HINT}"
        )
    return path


def standin_env(**options: Any) -> dict[str, str]:
    """The environment that puts the scheduler stand-in in place (``options``: see
    :mod:`.scheduler`); empty with ``SMG_TS_REAL_SCHEDULER=1`` (a GPU machine runs the real one,
    ``tools/gpu/tokenspeed_check.sh``)."""
    if setting_value(REAL_SCHEDULER):
        return {}
    return {"SMG_TOKENSPEED_SCHEDULER": STANDIN_ENTRY, "SMG_TS_STANDIN": json.dumps(options)}


def serve_command(
    model: Path, port: int, *extra: str, python: Path | None = None, module: str | None = None
) -> list[str]:
    """``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns) on the tiny model."""
    return [
        str(python or tokenspeed_python()), "-m", module or "smg_grpc_servicer.tokenspeed",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        *CPU_FLAGS, *extra,
    ]  # fmt: skip

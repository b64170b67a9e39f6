"""Running TokenSpeed on a CPU for tests (imports no TokenSpeed).

:func:`serve_command` takes the interpreter of an environment that has TokenSpeed: this module holds
no path of its own (the checkout's test kit says where its TokenSpeed environment is).
:mod:`.scheduler` is the stand-in for TokenSpeed's GPU scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smg_servicer_core.config import Setting, parse_bool, setting_value

REAL_SCHEDULER = Setting(
    "real_scheduler", parse_bool, False, "run the tests on TokenSpeed's real (GPU) scheduler",
    env="SMG_TS_REAL_SCHEDULER",
)  # fmt: skip
#: The scheduler stand-in's entry (``SMG_TOKENSPEED_SCHEDULER``).
STANDIN_ENTRY = "smg_servicer_tokenspeed.testing.scheduler:run"
#: TokenSpeed flags for the float32 tiny model on a CPU (``--device`` only takes cuda/npu; on
#: this path nothing touches it).
CPU_FLAGS = ("--max-model-len", "1024", "--log-level", "warning")


def standin_env(**options: Any) -> dict[str, str]:
    """The environment that puts the scheduler stand-in in place (``options``: see
    :mod:`.scheduler`); empty with ``SMG_TS_REAL_SCHEDULER=1`` (a GPU machine runs the real one,
    ``tools/gpu/tokenspeed_check.sh``)."""
    if setting_value(REAL_SCHEDULER):
        return {}
    return {"SMG_TOKENSPEED_SCHEDULER": STANDIN_ENTRY, "SMG_TS_STANDIN": json.dumps(options)}


def serve_command(
    model: Path, port: int, *extra: str, python: Path, module: str | None = None
) -> list[str]:
    """``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns) on the tiny model,
    with ``python``: the interpreter of an environment that has TokenSpeed."""
    return [
        str(python), "-m", module or "smg_grpc_servicer.tokenspeed",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        *CPU_FLAGS, *extra,
    ]  # fmt: skip

"""The MLX worker with an engine that dies on demand, for the engine-death case of the
reliability suite: ``python -m smg_it.mlx_dying_engine ARGS`` runs
``python -m smg_grpc_servicer.mlx ARGS`` (the seed's command) after one change at the engine's
boundary: once the file named by ``SMG_IT_ENGINE_FAULT_FILE`` exists, mlx-lm's
``BatchGenerator.next`` (the decoding step) raises, as a failing MLX array operation would.

That is the death an MLX user meets: MLX generates on a thread of the worker's own process, so
its engine dying is that thread ending while the process lives (SIGKILLing the process tests the
operating system, not the worker). Test-only: the worker's code is not touched."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

FAULT_FILE = "SMG_IT_ENGINE_FAULT_FILE"
MODULE = "smg_grpc_servicer.mlx"


def with_dying_engine(cmd: list[str], env: dict[str, str], trigger: Path) -> None:
    """Make an MLX worker's command (``python -m smg_grpc_servicer.mlx ...``) this module's,
    its engine dying once ``trigger`` exists (``cmd`` and ``env`` changed in place)."""
    at = cmd.index(MODULE)
    assert cmd[at - 1] == "-m", cmd
    cmd[at] = __name__
    here = str(Path(__file__).resolve().parents[1])  # tests-integration, for `-m smg_it...`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env[FAULT_FILE] = str(trigger)


def main() -> None:
    from mlx_lm.generate import BatchGenerator

    trigger = Path(os.environ[FAULT_FILE])
    step = BatchGenerator.next

    def next_or_die(self: Any, *args: Any, **kwargs: Any) -> Any:
        if trigger.exists():
            raise RuntimeError("injected engine fault (smg_it.mlx_dying_engine)")
        return step(self, *args, **kwargs)

    BatchGenerator.next = next_or_die  # pyright: ignore[reportAttributeAccessIssue]
    sys.argv = [MODULE, *sys.argv[1:]]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

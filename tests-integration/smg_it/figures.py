"""The reliability suite's figures file, shared by every test environment (the workspace's, and
SGLang's and TokenSpeed's own), read by ``tools/reliability_report.py``.

    record("vllm", storm_requests=1000, storm_leaked=0)

The file is ``.cache/reliability/figures.json`` under the checkout (``SMG_RELIABILITY_FIGURES``
overrides): one JSON object per engine, merged on every call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smg_it.paths import CACHE
from smg_servicer_core.config import Setting, setting_value

FIGURES = Setting("figures", str, "", "the reliability figures file", env="SMG_RELIABILITY_FIGURES")


def figures_path() -> Path:
    override = setting_value(FIGURES)
    if override:
        return Path(override)
    return CACHE / "reliability" / "figures.json"


def record(engine: str, **figures: Any) -> None:
    """Merge ``figures`` into ``engine``'s entry of the figures file."""
    path = figures_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault(engine, {}).update(figures)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))

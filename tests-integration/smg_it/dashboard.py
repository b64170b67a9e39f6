"""The Grafana dashboard in ``dashboards/smg-servicer.json``, read as its checks need it: which
metrics its queries name, for which engines (each row's description says ``engines: a, b``, and
``; when: FEATURE`` for a row whose metrics exist only with a feature on, such as ``lora``; the
panels below a row are that row's), and whether a worker's ``/metrics`` exports them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from smg_it.paths import REPO

DASHBOARD = REPO / "dashboards" / "smg-servicer.json"
#: A metric a PromQL query names: ours, or an engine's own (vLLM's ``vllm:*``).
METRIC = re.compile(r"\b(smg_servicer_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
#: The sample suffixes of a family: a counter's ``_total``, a histogram's series.
SUFFIXES = ("_total", "_bucket", "_sum", "_count")
ENGINES_SAID = re.compile(r"^engines: ([a-z, ]+)(?:; when: ([a-z_]+))?$")


def _exprs(node: Any) -> list[str]:
    """Every PromQL string under ``node``: targets' ``expr``, template queries."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        query = node.get("query")
        if isinstance(query, dict) and isinstance(query.get("query"), str):
            found.append(query["query"])
        return found + [e for k, v in node.items() if k != "query" for e in _exprs(v)]
    if isinstance(node, list):
        return [e for item in node for e in _exprs(item)]
    return []


def queried_metrics(
    path: Path = DASHBOARD, features: frozenset[str] = frozenset()
) -> dict[str, set[str]]:
    """engine -> the metrics the dashboard's queries name for it: the template variables' for
    every engine a row names, each panel's for its row's engines (a row that needs a feature:
    only when ``features`` holds it)."""
    board = json.loads(path.read_text())
    wanted: dict[str, set[str]] = {}
    engines: list[str] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            said = ENGINES_SAID.match(panel.get("description", ""))
            if said is None:
                raise ValueError(f"row {panel['title']!r}: its description says no `engines: ...`")
            needs = said.group(2)
            engines = [e.strip() for e in said.group(1).split(",")]
            engines = engines if needs is None or needs in features else ["-"]
            continue
        if not engines:
            raise ValueError(f"panel {panel['title']!r} sits above every row")
        names = {m for e in _exprs(panel.get("targets", [])) for m in METRIC.findall(e)}
        if not names:
            raise ValueError(f"panel {panel['title']!r} queries no metric")
        for engine in engines:
            wanted.setdefault(engine, set()).update(names)
    wanted.pop("-", None)  # a row whose feature is off
    everywhere = {m for e in _exprs(board.get("templating", {})) for m in METRIC.findall(e)}
    return {engine: names | everywhere for engine, names in wanted.items()}


def exported(metric: str, families: set[str]) -> bool:
    """Whether a query's ``metric`` is a family ``/metrics`` exports (``families`` as
    :func:`smg_servicer_core.testing.metrics.family_names` reads them: counters without
    ``_total``, histograms by their base name)."""
    if metric in families:
        return True
    return any(metric.endswith(s) and metric.removesuffix(s) in families for s in SUFFIXES)

"""The Grafana dashboard is well-formed and the reading of it that the live check
(``tests-integration/test_router.py``: every metric it queries is exported by a worker of each
engine it names) relies on is right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smg_it import dashboard

pytestmark = pytest.mark.unit


def test_the_dashboard_names_each_engines_metrics() -> None:
    board = json.loads(dashboard.DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    wanted = dashboard.queried_metrics()
    assert set(wanted) == {"mlx", "sglang", "tokenspeed", "vllm"}
    everywhere = set.intersection(*wanted.values())
    shared = ("rpc_requests_total", "generate_time_to_first_token_seconds_bucket",
              "generate_inter_chunk_seconds_bucket", "generate_streams_in_flight",
              "generate_aborts_total", "engine_waiting_requests", "kv_events_total")  # fmt: skip
    for family in shared:
        assert f"smg_servicer_{family}" in everywhere, family
    assert {m for m in wanted["vllm"] if m.startswith("vllm:")} >= {
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
    }  # fmt: skip
    assert not any(m.startswith("vllm:") for m in wanted["mlx"] | wanted["sglang"])
    lora = dashboard.queried_metrics(features=frozenset({"lora"}))["sglang"] - wanted["sglang"]
    assert lora == {"smg_servicer_lora_adapters_loaded", "smg_servicer_lora_updates_total"}


def test_a_query_of_a_metric_nobody_exports_is_caught(tmp_path: Path) -> None:
    board = {
        "panels": [
            {"id": 1, "type": "row", "title": "r", "description": "engines: mlx"},
            {"id": 2, "type": "timeseries", "title": "p",
             "targets": [{"expr": "rate(smg_servicer_made_up_total[5m])"},
                         {"expr": "rate(smg_servicer_rpc_duration_seconds_bucket[5m])"}]},
        ]
    }  # fmt: skip
    path = tmp_path / "board.json"
    path.write_text(json.dumps(board))
    wanted = dashboard.queried_metrics(path)["mlx"]
    families = {"smg_servicer_rpc_duration_seconds", "smg_servicer_rpc_requests"}
    missing = {m for m in wanted if not dashboard.exported(m, families)}
    assert missing == {"smg_servicer_made_up_total"}
    board["panels"][0]["description"] = "for everyone"
    path.write_text(json.dumps(board))
    with pytest.raises(ValueError, match="engines"):
        dashboard.queried_metrics(path)

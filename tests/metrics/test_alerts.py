"""The alert rules name only metrics we export, and every alert has its runbook section in docs/OPERATIONS.md."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXPORTED = {
    "batch_lines_completed_total",
    "batch_lines_failed_total",
    "shard_duration_seconds_bucket",
    "triton_call_duration_seconds_bucket",
    "triton_calls_in_flight",
    "quota_rejections_total",
    "webhook_deliveries_total",
    "batch_shards_runnable",
    "batch_lines_runnable",
    "batch_shards_running",
    "batch_lines_running",
    "batch_oldest_runnable_age_seconds",
    "batch_runnable_deadline_seconds",
    "batch_shards_dead",
    "triton_server_breaker_open",
    "fleet_placements",
    "fleet_instances",
}


def _rules() -> list[dict]:
    groups = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alerts_use_exported_metrics_and_have_runbooks():
    operations = (REPO / "docs/OPERATIONS.md").read_text()
    headings = set(re.findall(r"^### (\w+)$", operations, flags=re.MULTILINE))
    rules = _rules()
    assert {r["alert"] for r in rules} >= {
        "BatchQueueAgeHigh",
        "BatchDeadlineAtRisk",
        "BatchDeadShards",
        "BatchLineErrorRateHigh",
        "TritonBreakerOpen",
    }
    for rule in rules:
        assert rule["alert"] in headings, rule["alert"]
        assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())
        names = set(re.findall(r"\b([a-z_]+(?:_total|_seconds|_open|_dead|_runnable|_running))\b", rule["expr"]))
        assert names and names <= EXPORTED, (rule["alert"], names - EXPORTED)
        for name in names:
            assert f"`{name.removesuffix('_bucket')}`" in operations, name

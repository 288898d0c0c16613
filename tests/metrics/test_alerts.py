"""The alert rules name only metrics we export, and every alert has its runbook page in docs/operations/runbooks/."""

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
    metrics_page = (REPO / "docs/operations/metrics.md").read_text()
    runbooks_index = (REPO / "docs/operations/runbooks/README.md").read_text()
    rules = _rules()
    assert {r["alert"] for r in rules} >= {
        "BatchQueueAgeHigh",
        "BatchDeadlineAtRisk",
        "BatchDeadShards",
        "BatchLineErrorRateHigh",
        "TritonBreakerOpen",
    }
    for rule in rules:
        alert = rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations/runbooks/{alert}.md", (alert, url)
        runbook = REPO / url
        assert runbook.is_file(), url
        assert runbook.read_text().startswith(f"# {alert}\n"), url
        assert f"({alert}.md)" in runbooks_index, alert
        names = set(re.findall(r"\b([a-z_]+(?:_total|_seconds|_open|_dead|_runnable|_running))\b", rule["expr"]))
        assert names and names <= EXPORTED, (alert, names - EXPORTED)
        for name in names:
            assert f"`{name.removesuffix('_bucket')}`" in metrics_page, name

"""`batchctl usage --report costs|tensors` and `--csv` against the fake API."""

from __future__ import annotations

import csv
import io

from tests.cli.fake_api import Reply

BUCKET = {"object": "bucket", "start_time": 1764460800, "end_time": 1764547200}


def test_costs_as_csv_with_amount_and_currency_columns(cli, fake_api):
    results = [
        {
            "object": "organization.costs.result",
            "amount": {"value": 0.125, "currency": "usd", "exact": "0.125000000"},
            "line_item": None,
            "project_id": None,
            "api_key_id": None,
            "model": "all-MiniLM-L6-v2",
            "batch_id": None,
        }
    ]
    fake_api.on(
        "GET",
        "/organization/costs",
        Reply(body={"object": "page", "data": [{**BUCKET, "results": results}], "has_more": False, "next_page": None}),
    )
    result = cli("usage", "--report", "costs", "--start", "1764460800", "--group-by", "model", "--csv")
    assert result.exit_code == 0, result.output
    [seen] = fake_api.requests("GET", "/organization/costs")
    assert seen.query["group_by[]"] == ["model"]
    [row] = list(csv.DictReader(io.StringIO(result.stdout)))
    assert row == {
        "start_time": "1764460800",
        "end_time": "1764547200",
        "model": "all-MiniLM-L6-v2",
        "currency": "usd",
        "amount": "0.125",
    }


def test_tensor_rows_table(cli, fake_api):
    results = [
        {"object": "organization.usage.tensors.result", "rows": 4096, "num_model_requests": 12, "model": "identity"}
    ]
    fake_api.on(
        "GET",
        "/organization/usage/tensors",
        Reply(body={"object": "page", "data": [{**BUCKET, "results": results}], "has_more": False, "next_page": None}),
    )
    result = cli("usage", "--report", "tensors", "--start", "1764460800")
    assert result.exit_code == 0, result.output
    assert "identity" in result.stdout and "4,096" in result.stdout


def test_a_server_without_the_report_exits_2_naming_its_path(cli, fake_api):
    result = cli("usage", "--report", "costs")
    assert result.exit_code == 2
    assert f"GET {fake_api.base_url}/organization/costs answered 404" in result.stderr

"""``/v1/organization/usage/*`` and ``/v1/organization/costs``: OpenAI's shapes, buckets, groups, CSV,
tenant isolation, 400s, and the monthly spend cap's 429."""

from __future__ import annotations

import csv
import datetime
import io
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.core.messaging import dispatch
from controlplane.usage.models import UsageRecord
from tests.support.batches import jsonl, upload
from tests.usage.helpers import embedding_lines, price_set, run_batch, tensor_lines

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400


def _spread(batch_id: str, start: datetime.datetime, step: datetime.timedelta) -> None:
    """Move a batch's ledger rows to start, start + step, ... so they land in different buckets."""
    for i, row in enumerate(UsageRecord.objects.filter(batch_id=batch_id).order_by("id")):
        UsageRecord.objects.filter(id=row.id).update(finished_at=start + i * step)


def _sum(page: dict, field: str) -> int:
    return sum(result[field] for bucket in page["data"] for result in bucket["results"])


@pytest.mark.parametrize(
    ("width", "step", "limit"),
    [
        ("1m", datetime.timedelta(seconds=50), 60),
        ("1h", datetime.timedelta(minutes=40), 24),
        ("1d", datetime.timedelta(hours=20), 7),
    ],
)
def test_usage_sums_to_the_batch_across_buckets(tenant, api, width, step, limit):
    batch = run_batch(tenant, embedding_lines(12))
    start = timezone.now().replace(microsecond=0) - datetime.timedelta(days=5)
    _spread(batch.id, start, step)
    t0 = int(start.timestamp())
    response = api.get(
        "/v1/organization/usage/embeddings", {"start_time": t0, "end_time": t0 + 6 * DAY, "bucket_width": width}
    )
    assert response.status_code == 200, response.content
    page = response.json()
    assert page["object"] == "page"
    buckets = page["data"]
    assert len(buckets) == min(limit, 6 * DAY // {"1m": 60, "1h": 3600, "1d": DAY}[width])
    assert buckets[0]["start_time"] == t0 and buckets[0]["object"] == "bucket"
    # Follow next_page to the end: the buckets together hold the whole batch.
    pages = [page]
    while page["has_more"]:
        page = api.get(
            "/v1/organization/usage/embeddings",
            {"start_time": t0, "end_time": t0 + 6 * DAY, "bucket_width": width, "page": page["next_page"]},
        ).json()
        pages.append(page)
        assert len(pages) < 200
    assert sum(_sum(p, "input_tokens") for p in pages) == batch.prompt_tokens
    assert sum(_sum(p, "num_model_requests") for p in pages) == batch.completed_lines == 12
    non_empty = [b for p in pages for b in p["data"] if b["results"]]
    assert len(non_empty) > 1  # the rows really fell in several buckets
    result = non_empty[0]["results"][0]
    assert result["object"] == "organization.usage.embeddings.result"
    assert result["model"] is None  # not grouped


def test_group_by_model_batch_and_api_key_both_spellings(tenant, api):
    first = run_batch(tenant, embedding_lines(4))
    second = run_batch(tenant, embedding_lines(5, prefix="s"))
    t0 = int(timezone.now().timestamp()) - 3600
    for query in ("group_by=model&group_by=batch", "group_by[]=model&group_by[]=batch"):
        page = api.get(f"/v1/organization/usage/embeddings?start_time={t0}&{query}").json()
        results = [r for b in page["data"] for r in b["results"]]
        assert {(r["model"], r["batch_id"]): r["num_model_requests"] for r in results} == {
            ("all-MiniLM-L6-v2", first.id): 4,
            ("all-MiniLM-L6-v2", second.id): 5,
        }
    page = api.get("/v1/organization/usage/embeddings", {"start_time": t0, "group_by[]": "api_key_id"}).json()
    assert [r["api_key_id"] for b in page["data"] for r in b["results"]] == [None]  # created through services


def test_costs_equal_the_batch_costs_and_line_items(tenant, api):
    price_set("all-MiniLM-L6-v2", tokens="20", gpu_second="0.5")
    price_set("identity", rows="3")
    embed = run_batch(tenant, embedding_lines(7))
    tensor = run_batch(tenant, tensor_lines(4), endpoint="/v2/infer")
    t0 = int(timezone.now().timestamp()) - 3600
    page = api.get("/v1/organization/costs", {"start_time": t0, "group_by": "batch"}).json()
    by_batch = {r["batch_id"]: Decimal(r["amount"]["exact"]) for b in page["data"] for r in b["results"]}
    for batch in (embed, tensor):
        assert by_batch[batch.id] == UsageRecord.objects.filter(batch_id=batch.id).aggregate(s=Sum("cost"))["s"] > 0
        detail = api.get(f"/v1/batches/{batch.id}").json()
        assert detail["cost"]["value"] == pytest.approx(float(by_batch[batch.id]))
    items = api.get("/v1/organization/costs", {"start_time": t0, "group_by[]": "line_item"}).json()
    lines = {r["line_item"]: Decimal(r["amount"]["exact"]) for b in items["data"] for r in b["results"]}
    assert sum(lines.values()) == sum(by_batch.values())
    assert lines["identity, rows"] == Decimal(3) * 7 / 1000  # 1+2+3+1 rows at 3 per 1k rows
    assert "all-MiniLM-L6-v2, tokens" in lines and "all-MiniLM-L6-v2, compute" in lines
    tensors = api.get("/v1/organization/usage/tensors", {"start_time": t0}).json()
    assert _sum(tensors, "rows") == 7


def test_csv_download(tenant, api):
    price_set("all-MiniLM-L6-v2", tokens="20")
    batch = run_batch(tenant, embedding_lines(6))
    t0 = int(timezone.now().timestamp()) - 3600
    # An explicit end: without one the last bucket ends "now", which moves between the two requests.
    window = {"start_time": t0, "end_time": t0 + 7200, "group_by": "batch"}
    by_header = api.get("/v1/organization/usage/embeddings", window, HTTP_ACCEPT="text/csv")
    by_format = api.get("/v1/organization/usage/embeddings", {**window, "format": "csv"})
    assert by_header.content == by_format.content
    assert by_header["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(by_header.content.decode())))
    assert [(r["batch_id"], int(r["input_tokens"]), int(r["num_model_requests"])) for r in rows] == [
        (batch.id, batch.prompt_tokens, 6)
    ]
    costs = api.get("/v1/organization/costs", {"start_time": t0}, HTTP_ACCEPT="text/csv")
    [row] = list(csv.DictReader(io.StringIO(costs.content.decode())))
    assert Decimal(row["amount"]) == UsageRecord.objects.aggregate(s=Sum("cost"))["s"] and row["currency"] == "usd"
    # A bad parameter is still a JSON error.
    bad = api.get("/v1/organization/costs", {"start_time": "x"}, HTTP_ACCEPT="text/csv")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "start_time"


def test_tenants_see_only_their_own_rows(tenant, other_tenant, api):
    run_batch(other_tenant, embedding_lines(5, prefix="o"))
    mine = run_batch(tenant, embedding_lines(2))
    t0 = int(timezone.now().timestamp()) - 3600
    page = api.get("/v1/organization/usage/embeddings", {"start_time": t0, "group_by": "batch"}).json()
    assert [r["batch_id"] for b in page["data"] for r in b["results"]] == [mine.id]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_tenant.raw_key}")
    page = other.get("/v1/organization/usage/embeddings", {"start_time": t0}).json()
    assert _sum(page, "num_model_requests") == 5
    assert APIClient().get("/v1/organization/costs", {"start_time": t0}).status_code == 401


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({}, "start_time"),
        ({"start_time": "yesterday"}, "start_time"),
        ({"start_time": 1700000000000}, "start_time"),
        ({"start_time": 100, "end_time": 50}, "end_time"),
        ({"start_time": 100, "bucket_width": "1w"}, "bucket_width"),
        ({"start_time": 100, "bucket_width": "1d", "limit": 32}, "limit"),
        ({"start_time": 100, "limit": "many"}, "limit"),
        ({"start_time": 100, "group_by": "tenant"}, "group_by"),
        ({"start_time": 100, "page": "page_7"}, "page"),
        ({"start_time": 100, "page": "nonsense"}, "page"),
    ],
)
def test_bad_parameters_are_400s_in_openai_shape(api, params, param):
    response = api.get("/v1/organization/usage/embeddings", params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_line_item_is_only_for_costs(api):
    assert api.get("/v1/organization/usage/embeddings", {"start_time": 1, "group_by": "line_item"}).status_code == 400
    assert api.get("/v1/organization/costs", {"start_time": 1, "group_by": "line_item"}).status_code == 200


def test_spend_cap_refuses_new_batches_with_a_429(tenant, api):
    price_set("all-MiniLM-L6-v2", tokens="100000")
    run_batch(tenant, embedding_lines(6))
    spent = UsageRecord.objects.aggregate(s=Sum("cost"))["s"]
    file = upload(tenant, jsonl(embedding_lines(1)))
    body = {"input_file_id": file.id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    tenant.monthly_spend_cap = spent + Decimal("1.00")
    tenant.save()
    assert api.post("/v1/batches", body, format="json").status_code == 200  # under the cap
    tenant.monthly_spend_cap = spent.quantize(Decimal("0.01"), rounding="ROUND_DOWN")
    tenant.save()
    refused = api.post("/v1/batches", body, format="json")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "spend_cap_exceeded" and error["type"] == "rate_limit_error"
    assert f"{tenant.monthly_spend_cap:.2f}" in error["message"]
    assert error["limit"]["name"] == "monthly_spend_cap" and Decimal(error["limit"]["current"]) >= Decimal(
        error["limit"]["value"]
    )
    assert int(refused["Retry-After"]) > 0 and refused["x-should-retry"] == "false"
    # Last month's spending does not count against this month.
    UsageRecord.objects.update(finished_at=timezone.now() - datetime.timedelta(days=40))
    assert api.post("/v1/batches", body, format="json").status_code == 200

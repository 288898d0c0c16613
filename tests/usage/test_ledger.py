"""The ledger: one row per finished shard, summing to the batch's usage, priced by the table in force."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, Shard
from controlplane.core.messaging import dispatch
from controlplane.usage import selectors
from controlplane.usage.models import UsageRecord
from tests.support.batches import jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch as run_shards_of
from tests.usage.helpers import embedding_lines, price_set, run_batch, tensor_lines

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_row_per_shard_summing_to_the_batch_usage(tenant):
    batch = run_batch(tenant, embedding_lines(10))
    rows = UsageRecord.objects.filter(batch_id=batch.id)
    assert rows.count() == Shard.objects.filter(batch_id=batch.id).count() == 3
    totals = rows.aggregate(ok=Sum("completed_lines"), bad=Sum("failed_lines"), tokens=Sum("tokens"))
    assert (totals["ok"], totals["bad"]) == (batch.completed_lines, batch.failed_lines) == (10, 0)
    assert totals["tokens"] == batch.prompt_tokens > 0
    assert set(rows.values_list("tenant_id", "model", "server", "compute_source")) == {
        (tenant.id, "all-MiniLM-L6-v2", "fake:0", "dispatch")
    }
    for row in rows:
        assert row.compute_seconds == row.dispatch_seconds >= 0


def test_cost_is_the_price_table_applied_to_the_rows(tenant):
    old = price_set("all-MiniLM-L6-v2", tokens="999", effective_from=timezone.now() - datetime.timedelta(days=2))
    current = price_set(
        "all-MiniLM-L6-v2",
        tokens="0.02",
        gpu_second="0.0004",
        effective_from=timezone.now() - datetime.timedelta(hours=1),
    )
    price_set("all-MiniLM-L6-v2", tokens="5", effective_from=timezone.now() + datetime.timedelta(days=1))
    batch = run_batch(tenant, embedding_lines(9))
    total = Decimal(0)
    for row in UsageRecord.objects.filter(batch_id=batch.id):
        assert row.price_id == current.id != old.id
        assert row.price_per_million_tokens == Decimal("0.02")
        expected = Decimal(row.tokens) * Decimal("0.02") / 1_000_000 + Decimal(repr(row.compute_seconds)) * Decimal(
            "0.0004"
        )
        assert row.cost == expected.quantize(Decimal("1e-9"))
        total += row.cost
    assert selectors.batch_cost(batch_id=batch.id).value == total > 0
    # A price edited afterwards never rewrites what was charged.
    current.per_million_tokens = Decimal(7)
    current.save()
    assert selectors.batch_cost(batch_id=batch.id).value == total


def test_tensor_models_are_charged_by_rows(tenant):
    price_set("identity", rows="0.5")
    batch = run_batch(tenant, tensor_lines(6), endpoint="/v2/infer")
    rows = UsageRecord.objects.filter(batch_id=batch.id)
    # Lines carry 1, 2, 3, 1, 2, 3 rows.
    assert rows.aggregate(r=Sum("rows"))["r"] == 12
    assert rows.aggregate(t=Sum("tokens"))["t"] == 0
    assert sum(r.cost for r in rows) == Decimal("0.006")


def test_api_key_that_created_the_batch_is_on_its_rows(tenant, api):
    file = upload(tenant, jsonl(embedding_lines(2)))
    created = api.post(
        "/v1/batches",
        {"input_file_id": file.id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
        format="json",
    )
    assert created.status_code == 200, created.content
    batch_id = created.json()["id"]
    assert created.json()["cost"] == {"value": 0.0, "currency": "usd"}
    services.batch_validate(batch_id=batch_id)
    run_shards_of(Batch.objects.get(id=batch_id), FakeBackend(), owner="t")
    key_id = tenant.api_keys.get().id
    assert set(UsageRecord.objects.filter(batch_id=batch_id).values_list("api_key_id", flat=True)) == {key_id}


def test_cost_by_tenant_per_day_and_idle_capacity(tenant, other_tenant):
    price_set("all-MiniLM-L6-v2", tokens="1000")
    first = run_batch(tenant, embedding_lines(5))
    second = run_batch(other_tenant, embedding_lines(3, prefix="o"))
    yesterday = timezone.now() - datetime.timedelta(days=1)
    UsageRecord.objects.filter(batch_id=second.id).update(finished_at=yesterday)
    today = timezone.now().date()
    days = selectors.cost_by_tenant_per_day(start=today - datetime.timedelta(days=1), end=today + datetime.timedelta(1))
    assert [(d.day, d.tenant_name, d.model, d.currency) for d in days] == [
        (yesterday.date(), "tenant-b", "all-MiniLM-L6-v2", "usd"),
        (today, "tenant-a", "all-MiniLM-L6-v2", "usd"),
    ]
    assert days[1].amount == selectors.batch_cost(batch_id=first.id).value > 0
    assert days[0].tenant_id == str(other_tenant.id)
    # End is exclusive.
    assert selectors.cost_by_tenant_per_day(start=today, end=today) == []

    idle = selectors.idle_capacity_per_day(start=today, end=today + datetime.timedelta(days=1))
    attributed = UsageRecord.objects.filter(batch_id=first.id).aggregate(s=Sum("compute_seconds"))["s"]
    assert len(idle) == 1 and idle[0].attributed_seconds == pytest.approx(attributed)
    assert idle[0].instance_seconds == 0.0

"""The monthly spend cap while batches run: a tenant at its cap gets no more shards claimed, its running batches
end with ``spend_cap_exceeded`` lines for what did not run (finished lines kept), other tenants run on, and a
raised cap or a new month lifts it."""

from __future__ import annotations

import datetime
import json
from decimal import ROUND_DOWN, Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.render import batch_render
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from controlplane.tenants.models import Tenant
from controlplane.usage.models import DEFAULT_CURRENCY, UsageRecord
from controlplane.usage.spendcap import spend_caps_refresh
from tests.support.batches import file_records, jsonl, upload, validated_batch
from tests.support.fakes import FakeBackend
from tests.support.running import run_next
from tests.usage.helpers import embedding_lines, price_set

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "all-MiniLM-L6-v2"


def _started(tenant: Tenant, lines: list[dict]) -> Batch:
    return validated_batch(tenant, lines, endpoint="/v1/embeddings")


def _cap_at_spent(tenant: Tenant) -> Decimal:
    spent = UsageRecord.objects.filter(tenant=tenant).aggregate(s=Sum("cost"))["s"]
    assert spent and spent > 0
    cap = spent.quantize(Decimal("0.01"), rounding=ROUND_DOWN)
    Tenant.objects.filter(id=tenant.id).update(monthly_spend_cap=cap)
    return cap


def test_the_shard_whose_charge_reaches_the_cap_marks_the_tenant_at_its_commit(tenant, other_tenant):
    # No beat run between: the commit that reaches the cap marks the tenant, so the next claim skips its shards.
    price_set(MODEL, tokens="100000")
    capped = _started(tenant, embedding_lines(12))  # three shards of four lines
    assert run_next(MODEL, FakeBackend()).outcome == "succeeded"
    per_shard = UsageRecord.objects.get(tenant=tenant).cost
    Tenant.objects.filter(id=tenant.id).update(monthly_spend_cap=per_shard * 2 - Decimal("0.000001"))
    assert Tenant.objects.get(id=tenant.id).spend_capped_at is None  # one shard's charge is under the cap
    assert Shard.objects.get(id=run_next(MODEL, FakeBackend()).shard_id).batch_id == capped.id
    assert Tenant.objects.get(id=tenant.id).spend_capped_at is not None  # marked at that commit
    other = _started(other_tenant, embedding_lines(4, prefix="o"))
    ran = []
    while (cycle := run_next(MODEL, FakeBackend())) is not None:
        ran.append(Shard.objects.get(id=cycle.shard_id).batch_id)
    assert ran == [other.id]
    assert Shard.objects.filter(batch=capped, status=ShardStatus.PENDING).count() == 1
    assert Tenant.objects.get(id=other_tenant.id).spend_capped_at is None  # no cap: never marked


def test_a_tenant_at_its_cap_mid_batch_is_not_claimed_and_its_batch_ends_with_spend_cap_errors(tenant, other_tenant):
    price_set(MODEL, tokens="100000")
    capped = _started(tenant, embedding_lines(12))  # three shards of four lines
    assert run_next(MODEL, FakeBackend()).outcome == "succeeded"  # alone: its first shard
    cap = _cap_at_spent(tenant)
    other = _started(other_tenant, embedding_lines(8, prefix="o"))

    # The mark alone stops the claims: every shard claimed from here is the other tenant's.
    assert [r.tenant_id for r in spend_caps_refresh(now=timezone.now())] == [tenant.id]
    ran = []
    while (cycle := run_next(MODEL, FakeBackend())) is not None:
        ran.append(Shard.objects.get(id=cycle.shard_id).batch_id)
    assert ran == [other.id, other.id]
    assert Shard.objects.filter(batch=capped, status=ShardStatus.PENDING).count() == 2
    assert Batch.objects.get(id=other.id).status == BatchStatus.COMPLETED

    # The beat job ends the capped tenant's batch: finished lines kept, the rest spend_cap_exceeded errors.
    assert services.batches_stop_spend_capped() == [capped.id]
    assert services.batches_stop_spend_capped() == []  # already stopping
    assert batch_render(Batch.objects.get(id=capped.id))["status"] == "in_progress"
    assert batch_try_finalize(batch_id=capped.id)
    capped = Batch.objects.get(id=capped.id)
    assert capped.status == BatchStatus.EXPIRED
    assert [r["custom_id"] for r in file_records(capped.output_file_id)] == [f"r{i}" for i in range(4)]
    errors = file_records(capped.error_file_id)
    assert [r["custom_id"] for r in errors] == [f"r{i}" for i in range(4, 12)]
    assert {e["error"]["code"] for e in errors} == {"spend_cap_exceeded"}
    spent = UsageRecord.objects.filter(tenant=tenant).aggregate(s=Sum("cost"))["s"]
    message = errors[0]["error"]["message"]
    assert f"{cap:.2f} {DEFAULT_CURRENCY}" in message and f"{spent:.2f} {DEFAULT_CURRENCY}" in message
    assert (capped.completed_lines, capped.failed_lines) == (4, 8)
    rendered = batch_render(capped)
    assert rendered["errors"]["data"][0]["code"] == "spend_cap_exceeded"
    assert rendered["request_counts"] == {"total": 12, "completed": 4, "failed": 8}
    # Nothing else was charged for the stopped batch.
    assert UsageRecord.objects.filter(batch_id=capped.id).count() == 1


def test_a_raised_cap_or_a_new_month_lets_the_tenant_run_again(tenant):
    price_set(MODEL, tokens="100000")
    _started(tenant, embedding_lines(4))
    assert run_next(MODEL, FakeBackend()).outcome == "succeeded"
    _cap_at_spent(tenant)
    spend_caps_refresh(now=timezone.now())
    assert Tenant.objects.get(id=tenant.id).spend_capped_at is not None

    Tenant.objects.filter(id=tenant.id).update(monthly_spend_cap=Decimal("1000000"))
    assert services.batches_stop_spend_capped() == []
    assert Tenant.objects.get(id=tenant.id).spend_capped_at is None
    batch = _started(tenant, embedding_lines(4, prefix="n"))
    assert Shard.objects.get(id=run_next(MODEL, FakeBackend()).shard_id).batch_id == batch.id

    _cap_at_spent(tenant)
    spend_caps_refresh(now=timezone.now())
    assert Tenant.objects.get(id=tenant.id).spend_capped_at is not None
    UsageRecord.objects.update(finished_at=timezone.now() - datetime.timedelta(days=40))  # last month's
    assert spend_caps_refresh(now=timezone.now()) == []
    assert Tenant.objects.get(id=tenant.id).spend_capped_at is None


def test_a_running_shard_of_a_capped_batch_commits_what_it_finished(tenant):
    price_set(MODEL, tokens="100000")
    batch = _started(tenant, embedding_lines(8))
    assert run_next(MODEL, FakeBackend()).outcome == "succeeded"
    _cap_at_spent(tenant)
    # The stop lands while the second shard runs: it stops between calls, keeping the lines it finished.
    backend = FakeBackend(on_call=lambda calls: calls == 1 and services.batches_stop_spend_capped())
    outcome = run_next(MODEL, backend).outcome
    assert outcome in {"stopped", "succeeded"}
    batch_try_finalize(batch_id=batch.id)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.EXPIRED
    ids = [r["custom_id"] for r in file_records(batch.output_file_id)] + [
        r["custom_id"] for r in file_records(batch.error_file_id)
    ]
    assert sorted(ids) == sorted(f"r{i}" for i in range(8))  # each line once, in one of the two files

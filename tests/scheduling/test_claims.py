"""Claims by policy on real Postgres: one winner per shard under contention, fair share between
tenants, priorities, pauses and deferrals."""

from __future__ import annotations

import math
import os
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.batches.models import Batch, BatchEvent, Shard, ShardStatus
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from controlplane.scheduling.models import TenantShare
from controlplane.tenants.models import Tenant
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet(settings, monkeypatch, catalogue):
    # The tests drive claims themselves; nothing goes to the broker.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    settings.SCHEDULER_AGING_SECONDS = 3600.0


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def _claim_tenants(n: int) -> list[str]:
    order = []
    for _ in range(n):
        shard = shard_claim_next(model=_identity(), owner="t")
        assert shard is not None
        order.append(shard.batch.tenant.name)
    return order


def test_two_claimers_never_win_the_same_shard(quiet):
    """1,000 rounds: two threads released together by a barrier race for the one runnable shard (CLAIM_RACE_ROUNDS:
    fewer in `make test-fast`, the edit loop)."""
    rounds = int(os.environ.get("CLAIM_RACE_ROUNDS", "1000"))
    tenant = new_tenant("race")
    batch = runnable_batch(tenant, rounds * 2)  # 1,000 shards of two lines
    shard_ids = list(Shard.objects.filter(batch=batch).order_by("index").values_list("id", flat=True))
    far = timezone.now() + timedelta(days=1)
    Shard.objects.filter(batch=batch).update(not_before=far)
    model = _identity()
    barrier = threading.Barrier(2)
    results: list[list[int | None]] = [[], []]

    def claimer(slot: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()  # round starts: the main thread made exactly one shard runnable
                shard = shard_claim_next(model=model, owner=f"w{slot}")
                results[slot].append(shard.id if shard else None)
                barrier.wait()  # round ends
        finally:
            connection.close()

    control = threading.Barrier(3)
    barrier = control  # main thread joins each wait so it can open one shard per round
    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for shard_id in shard_ids:
        Shard.objects.filter(id=shard_id).update(not_before=None)
        control.wait()
        control.wait()
    for thread in threads:
        thread.join()
    for round_no, shard_id in enumerate(shard_ids):
        won = [r[round_no] for r in results if r[round_no] is not None]
        assert won == [shard_id], f"round {round_no}: {won}"
    assert set(Shard.objects.filter(batch=batch).values_list("status", flat=True)) == {ShardStatus.RUNNING}
    assert set(Shard.objects.filter(batch=batch).values_list("attempt", flat=True)) == {1}


def test_a_newcomer_is_served_at_the_next_claim(quiet):
    flood = new_tenant("flood")
    runnable_batch(flood, 40, prefix="a")
    assert _claim_tenants(5) == ["flood"] * 5
    newcomer = new_tenant("newcomer")
    runnable_batch(newcomer, 6, prefix="b")
    # The newcomer starts at the system clock, below the flooding tenant: it gets the next slot, then
    # the two alternate (equal weights, equal shard sizes).
    assert _claim_tenants(6) == ["newcomer", "flood", "newcomer", "flood", "newcomer", "flood"]


def test_weights_split_claims(quiet):
    heavy = new_tenant("heavy", weight=3.0)
    light = new_tenant("light", weight=1.0)
    runnable_batch(heavy, 80, prefix="h")
    runnable_batch(light, 80, prefix="l")
    order = _claim_tenants(40)
    assert order.count("heavy") == 30 and order.count("light") == 10
    shares = {s.tenant.name: s.served_work_units for s in TenantShare.objects.select_related("tenant")}
    assert shares == {"heavy": 60.0, "light": 20.0}


def test_high_priority_overtakes_and_low_waits(quiet):
    tenant = new_tenant("prio", max_priority="high")
    low = runnable_batch(tenant, 4, prefix="l", priority="low")
    normal = runnable_batch(tenant, 4, prefix="n", priority="normal")
    high = runnable_batch(tenant, 4, prefix="h", priority="high")
    order = [shard_claim_next(model=_identity(), owner="t").batch_id for _ in range(6)]
    assert order == [high.id, high.id, normal.id, normal.id, low.id, low.id]
    assert shard_claim_next(model=_identity(), owner="t") is None


def test_paused_tenant_and_model_and_deferred_shards_are_not_claimed(quiet):
    tenant = new_tenant("paused")
    batch = runnable_batch(tenant, 4)
    Tenant.objects.filter(id=tenant.id).update(paused=True)
    assert shard_claim_next(model=_identity(), owner="t") is None
    Tenant.objects.filter(id=tenant.id).update(paused=False)
    CatalogueModel.objects.filter(name="identity").update(paused=True)
    assert shard_claim_next(model=_identity(), owner="t") is None
    CatalogueModel.objects.filter(name="identity").update(paused=False)
    Shard.objects.filter(batch=batch).update(not_before=timezone.now() + timedelta(minutes=1))
    assert shard_claim_next(model=_identity(), owner="t") is None
    Shard.objects.filter(batch=batch, index=1).update(not_before=timezone.now() - timedelta(seconds=1))
    claimed = shard_claim_next(model=_identity(), owner="t")
    assert claimed is not None and claimed.index == 1 and claimed.not_before is None
    assert Batch.objects.get(id=batch.id).last_dispatched_at is not None


def test_batch_at_deadline_risk_is_promoted(quiet, settings):
    tenant = new_tenant("deadline", max_priority="high")
    high = runnable_batch(tenant, 6, prefix="h", priority="high")
    low = runnable_batch(tenant, 6, prefix="l", priority="low")
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=4.0)  # 2 slots: 0.5 rows/s
    assert shard_claim_next(model=_identity(), owner="t").batch_id == high.id  # an hour left: no risk
    # The low batch's remaining rows (12 s of work) need more than half of the 10 s it has left.
    Batch.objects.filter(id=low.id).update(expires_at=timezone.now() + timedelta(seconds=10))
    assert shard_claim_next(model=_identity(), owner="t").batch_id == low.id
    promoted = BatchEvent.objects.filter(kind="deadline_promoted").values_list("batch_id", flat=True)
    assert list(promoted) == [low.id]  # the audit trail says why it overtook the high batch, once


def test_fifo_policy_serves_the_oldest_batch_first(quiet, settings):
    settings.SCHEDULER_POLICY = "fifo"
    first, second = new_tenant("first"), new_tenant("second", max_priority="high")
    older = runnable_batch(first, 6, prefix="a")
    runnable_batch(second, 6, prefix="b", priority="high")
    assert [shard_claim_next(model=_identity(), owner="t").batch_id for _ in range(3)] == [older.id] * 3


def test_deadline_promotion_sticks_until_the_batch_is_done(quiet):
    tenant = new_tenant("sticky")
    flood = runnable_batch(tenant, 8, prefix="f")
    late = runnable_batch(tenant, 6, prefix="l", priority="low")
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=4.0)  # 0.5 rows/s
    Batch.objects.filter(id=late.id).update(expires_at=timezone.now() + timedelta(seconds=20))
    # 6 rows need 12 s > 0.5 × 20 s: promoted. After one shard 4 rows need 8 s < 10 s — no longer at
    # risk by the formula, but the promotion sticks, so the batch keeps the slot until it is done.
    assert [shard_claim_next(model=_identity(), owner="t").batch_id for _ in range(3)] == [late.id] * 3
    assert Batch.objects.get(id=late.id).deadline_promoted_at is not None
    assert shard_claim_next(model=_identity(), owner="t").batch_id == flood.id
    assert Batch.objects.get(id=flood.id).deadline_promoted_at is None


def test_a_busy_batch_row_does_not_hide_its_shards(quiet):
    """The claim locks only the shard row (FOR UPDATE OF self): while a commit holds the batch row for its
    counts, a concurrent claim must still find and take the batch's shard."""
    import time

    import psycopg

    batch = runnable_batch(new_tenant("busy"), 4)
    db = connection.settings_dict
    params = {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"], "dbname": db["NAME"]}
    holder = psycopg.connect(**params)
    observer = psycopg.connect(**params, autocommit=True)
    claimed: list[Shard | None] = []

    def claim() -> None:
        try:
            claimed.append(shard_claim_next(model=_identity(), owner="t"))
        finally:
            connection.close()

    try:
        holder.execute("UPDATE batches_batch SET completed_lines = completed_lines WHERE id = %s", (batch.id,))
        thread = threading.Thread(target=claim)
        thread.start()
        # The claim itself commits while the batch row is held (only its later timestamp update waits).
        deadline = time.monotonic() + 10
        running = 0
        while time.monotonic() < deadline and not running:
            running = observer.execute(
                "SELECT count(*) FROM batches_shard WHERE batch_id = %s AND status = 'running'", (batch.id,)
            ).fetchone()[0]
            time.sleep(0.05)
        assert running == 1
    finally:
        holder.rollback()
        holder.close()
        observer.close()
    thread.join(10)
    assert claimed and claimed[0] is not None and claimed[0].batch_id == batch.id

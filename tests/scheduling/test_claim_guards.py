"""The production claim's guards, each caught on its own (issue 24): the claim never waits on a shard row that
another transaction holds (``skip_locked=True`` in scheduling/claims.py), and the claim's UPDATE takes only a
shard that is still pending (the ``status`` guard in batches/shards.shard_claim_selected). Removing either
guard alone fails one of these tests."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from controlplane.batches.models import Shard, ShardStatus
from controlplane.batches.run.shards import PartSummary, shard_claim_selected, shard_commit
from controlplane.core import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from tests.scheduling.helpers import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)

row_locks = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks: SQLite has none (make test runs these on Postgres)"
)

# How long a claim may take before the test gives up on it, on a loaded 2-core machine; a claim that waits on
# the held row is caught sooner, by Postgres reporting it waiting on a lock.
GIVE_UP_SECONDS = 30.0


@pytest.fixture
def quiet(settings, monkeypatch, catalogue):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def _connect(**options: object) -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"], **options)  # type: ignore[call-overload]


def _claim_beside_held_rows(shard_ids: list[int]) -> tuple[Shard | None, float]:
    """Claim in a worker thread while another transaction holds these shard rows FOR UPDATE. Fails as soon as
    Postgres shows the claim waiting for a lock; else returns what it claimed and how long it took."""
    holder, observer = _connect(), _connect(autocommit=True)
    result: list[Shard | None] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            result.append(shard_claim_next(model=_identity(), owner="w2"))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=claim)
    try:
        holder.execute("SELECT id FROM batches_shard WHERE id = ANY(%s) FOR UPDATE", (shard_ids,))
        started = time.monotonic()
        thread.start()
        waiting = 0
        while thread.is_alive() and not waiting and time.monotonic() - started < GIVE_UP_SECONDS:
            thread.join(0.01)
            waiting = observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()[0]
        took = time.monotonic() - started
        assert not waiting, "the claim waited for a shard row another transaction holds"
        assert not thread.is_alive(), f"the claim did not return within {GIVE_UP_SECONDS} s"
    finally:
        holder.rollback()  # lets a claim that waited go on, so the thread ends
        thread.join(GIVE_UP_SECONDS)
        holder.close()
        observer.close()
    assert not errors, errors
    return result[0], took


@row_locks
def test_a_claim_takes_another_shard_when_the_next_one_is_held(quiet):
    batch = runnable_batch(new_tenant("held"), 6)  # three shards of two lines
    first, second, _ = Shard.objects.filter(batch=batch).order_by("index")
    claimed, took = _claim_beside_held_rows([first.id])  # a worker's claim transaction is on shard 0
    assert claimed is not None and claimed.id == second.id, claimed
    assert Shard.objects.get(id=first.id).status == ShardStatus.PENDING
    print(f"claim beside a held row: {took * 1000:.0f} ms")


@row_locks
def test_a_claim_returns_nothing_when_every_runnable_shard_is_held(quiet):
    batch = runnable_batch(new_tenant("all-held"), 4)
    ids = list(Shard.objects.filter(batch=batch).values_list("id", flat=True))
    claimed, took = _claim_beside_held_rows(ids)
    assert claimed is None
    assert set(Shard.objects.filter(batch=batch).values_list("status", flat=True)) == {ShardStatus.PENDING}
    print(f"claim with every row held: {took * 1000:.0f} ms")


def test_the_claim_update_takes_only_a_pending_shard(quiet):
    """The scheduler selects a shard and then takes it; a shard that left ``pending`` in between (SQLite has
    no row lock to prevent it) must not be taken from its worker or reopened once finished."""
    batch = runnable_batch(new_tenant("guard"), 4)
    running = shard_claim_next(model=_identity(), owner="w1")
    assert running is not None and running.attempt == 1
    assert shard_claim_selected(shard_id=running.id, owner="w2", now=timezone.now()) is None
    row = Shard.objects.get(id=running.id)
    assert (row.status, row.attempt, row.lease_owner) == (ShardStatus.RUNNING, 1, "w1")

    summary = PartSummary(part_name="parts/done", completed=2, failed=0, tokens=TokenCounts(), stopped=False)
    assert shard_commit(shard_id=running.id, attempt=1, summary=summary)
    assert shard_claim_selected(shard_id=running.id, owner="w3", now=timezone.now()) is None
    row = Shard.objects.get(id=running.id)
    assert (row.status, row.attempt, row.part_name) == (ShardStatus.SUCCEEDED, 1, "parts/done")

    # A pending one is taken: attempt + 1, a fresh lease, and the deferral it waited out cleared.
    pending = Shard.objects.get(batch=batch, index=1)
    Shard.objects.filter(id=pending.id).update(not_before=timezone.now() - timedelta(seconds=1))
    now = timezone.now()
    taken = shard_claim_selected(shard_id=pending.id, owner="w2", now=now)
    assert taken is not None and (taken.status, taken.attempt, taken.lease_owner) == (ShardStatus.RUNNING, 1, "w2")
    assert taken.not_before is None and taken.lease_expires_at > now

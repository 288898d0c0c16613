"""The production claim's guards, each caught on its own: the claim never waits on a shard row that
another transaction holds (``skip_locked=True`` in scheduling/claims.py), and the claim's UPDATE takes only a
shard that is still pending (the ``status`` guard in batches/shards.shard_claim_selected). Removing either
guard alone fails one of these tests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches.models import Shard, ShardStatus
from controlplane.batches.shards import PartSummary, shard_claim_selected, shard_commit
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from tests.support.row_locks import beside_held_rows
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet(settings, monkeypatch, catalogue):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def _claim_beside_held_rows(shard_ids: list[int]) -> tuple[Shard | None, float]:
    """A worker's claim while another transaction holds these shard rows FOR UPDATE (tests/support/row_locks.py)."""
    return beside_held_rows("batches_shard", shard_ids, lambda: shard_claim_next(model=_identity(), owner="w2"))


@pytest.mark.row_locks
def test_a_claim_takes_another_shard_when_the_next_one_is_held(quiet):
    batch = runnable_batch(new_tenant("held"), 6)  # three shards of two lines
    first, second, _ = Shard.objects.filter(batch=batch).order_by("index")
    claimed, took = _claim_beside_held_rows([first.id])  # a worker's claim transaction is on shard 0
    assert claimed is not None and claimed.id == second.id, claimed
    assert Shard.objects.get(id=first.id).status == ShardStatus.PENDING
    print(f"claim beside a held row: {took * 1000:.0f} ms")


@pytest.mark.row_locks
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

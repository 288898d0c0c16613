"""The attempt is the fencing token (batches/run/shards.py): a worker presumed dead whose shard was rescued and
claimed again can renew, release or commit nothing. Each test fails when the ``attempt=`` condition of that
one write is removed: the stale worker's call would then match the row the current attempt holds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches.models import Batch, BatchEvent, Shard, ShardStatus
from controlplane.batches.run.shards import PartSummary, shard_commit, shard_release, shard_renew, shards_rescue
from controlplane.core import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from controlplane.usage.models import UsageRecord
from tests.scheduling.helpers import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def taken_over(settings, monkeypatch, catalogue) -> tuple[Shard, Shard]:
    """A one-shard batch whose first worker (attempt 1) was presumed dead and whose shard the rescuer gave to a
    second worker (attempt 2, running): the first one's handle and the second one's."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    runnable_batch(new_tenant("fenced"), 2)
    model = CatalogueModel.objects.get(name="identity")
    stale = shard_claim_next(model=model, owner="w1")
    assert stale is not None and stale.attempt == 1
    Shard.objects.filter(id=stale.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert shards_rescue() == [stale.id]
    current = shard_claim_next(model=model, owner="w2")
    assert current is not None and (current.id, current.attempt) == (stale.id, 2)
    return stale, current


def _row(shard: Shard) -> Shard:
    return Shard.objects.get(id=shard.id)


def test_a_stale_attempt_cannot_renew_the_lease(taken_over):
    stale, current = taken_over
    before = _row(current).lease_expires_at
    assert shard_renew(shard_id=stale.id, attempt=stale.attempt) is False  # its keeper stops the stale run
    assert _row(current).lease_expires_at == before
    assert shard_renew(shard_id=current.id, attempt=current.attempt) is True
    assert _row(current).lease_expires_at > before


@pytest.mark.parametrize("content_failure", [True, False])
def test_a_stale_attempt_cannot_release_the_shard(taken_over, content_failure):
    stale, current = taken_over
    outcome = shard_release(
        shard_id=stale.id, attempt=stale.attempt, error="RuntimeError: stale", content_failure=content_failure
    )
    assert outcome is None  # the lease was lost: nothing changes
    row = _row(current)
    assert (row.status, row.attempt, row.lease_owner) == (ShardStatus.RUNNING, 2, "w2")
    assert (row.content_failures, row.last_error, row.not_before) == (0, "lease expired: worker lost", None)
    assert not BatchEvent.objects.filter(batch_id=row.batch_id, kind__startswith="shard_released").exists()
    # The current attempt can.
    assert shard_release(shard_id=current.id, attempt=2, error="x", content_failure=False) == ShardStatus.PENDING


def test_a_stale_attempt_cannot_commit_its_part(taken_over):
    stale, current = taken_over
    stale_part = PartSummary(part_name="parts/stale", completed=2, failed=0, tokens=TokenCounts(), stopped=False)
    assert shard_commit(shard_id=stale.id, attempt=stale.attempt, summary=stale_part) is False
    row = _row(current)
    assert (row.status, row.part_name, row.completed_lines) == (ShardStatus.RUNNING, "", 0)
    assert Batch.objects.get(id=row.batch_id).completed_lines == 0
    assert not UsageRecord.objects.filter(batch_id=row.batch_id).exists()
    current_part = PartSummary(part_name="parts/current", completed=2, failed=0, tokens=TokenCounts(), stopped=False)
    assert shard_commit(shard_id=current.id, attempt=current.attempt, summary=current_part) is True
    assert (_row(current).status, _row(current).part_name) == (ShardStatus.SUCCEEDED, "parts/current")
    assert UsageRecord.objects.filter(batch_id=row.batch_id).count() == 1

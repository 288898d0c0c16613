"""A tenant marked at its monthly spend cap (Tenant.spend_capped_at) is skipped by the claim, whatever the policy
would rank first; another tenant's shards are still claimed, and clearing the mark makes its shards runnable again."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.claims import shard_claim_next
from controlplane.scheduling.selectors import batches_queue_info, models_with_runnable_shards
from controlplane.tenants.models import Tenant
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet(settings, monkeypatch, catalogue):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def test_a_capped_tenant_is_not_claimed_and_others_are(quiet):
    capped_tenant = new_tenant("capped", max_priority="high")
    capped = runnable_batch(capped_tenant, 4, prefix="c", priority="high")  # the policy would serve it first
    other = runnable_batch(new_tenant("other"), 4, prefix="o")
    Tenant.objects.filter(id=capped_tenant.id).update(spend_capped_at=timezone.now())

    assert batches_queue_info([capped, other]).keys() == {other.id}  # not shown as queued either
    claimed = [shard_claim_next(model=_identity(), owner="t") for _ in range(3)]
    assert [s.batch_id if s else None for s in claimed] == [other.id, other.id, None]
    assert not models_with_runnable_shards(CatalogueModel.objects.all(), timezone.now()).exists()

    Tenant.objects.filter(id=capped_tenant.id).update(spend_capped_at=None)  # cap raised, or a new month
    assert shard_claim_next(model=_identity(), owner="t").batch_id == capped.id

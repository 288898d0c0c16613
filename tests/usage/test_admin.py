"""The ledger in the admin: prices editable and effective-dated, the spend cap on the tenant, the batch's
cost, and the daily view of cost per tenant and model and idle capacity."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.admin.utils import quote
from django.utils import timezone

from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.usage.models import CapacityInterval, Price
from controlplane.usage.selectors import batch_cost
from tests.usage.helpers import embedding_lines, price_set, run_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast(settings):
    # admin_client's superuser is hashed with PBKDF2 otherwise: about a second per test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_a_price_is_added_in_the_admin_and_charged_from_its_date(admin_client, tenant):
    model = CatalogueModel.objects.get(name="all-MiniLM-L6-v2")
    start = timezone.now() - datetime.timedelta(minutes=5)
    response = admin_client.post(
        "/admin/usage/price/add/",
        {
            "model": model.id,
            "effective_from_0": start.strftime("%Y-%m-%d"),
            "effective_from_1": start.strftime("%H:%M:%S"),
            "per_million_tokens": "50",
            "per_thousand_rows": "0",
            "per_gpu_second": "0",
            "currency": "usd",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    price = Price.objects.get()
    batch = run_batch(tenant, embedding_lines(5))
    assert batch_cost(batch_id=batch.id).value > 0
    page = admin_client.get(f"/admin/batches/batch/{quote(batch.id)}/change/").content.decode()
    assert f"{batch_cost(batch_id=batch.id).value:.6f} usd" in page
    assert admin_client.get("/admin/usage/usagerecord/").status_code == 200
    assert price.per_million_tokens == 50


def test_spend_cap_is_edited_on_the_tenant(admin_client, tenant):
    page = admin_client.get(f"/admin/tenants/tenant/{quote(tenant.id)}/change/").content.decode()
    assert 'name="monthly_spend_cap"' in page


def test_daily_view_shows_cost_per_tenant_and_model_and_idle_capacity(admin_client, tenant, other_tenant):
    price_set("all-MiniLM-L6-v2", tokens="1000")
    run_batch(tenant, embedding_lines(4))
    run_batch(other_tenant, embedding_lines(4, prefix="o"))
    now = timezone.now()
    CapacityInterval.objects.create(
        server="s1",
        triton_model="minilm",
        started_at=now - datetime.timedelta(seconds=15),
        ended_at=now,
        instances=4,
        instance_seconds=60.0,
        busy_seconds=1.0,
        attributed_seconds=1.0,
    )
    response = admin_client.get("/admin/usage/usagerecord/daily/?days=7")
    assert response.status_code == 200
    page = response.content.decode()
    assert "tenant-a" in page and "tenant-b" in page and "all-MiniLM-L6-v2" in page
    assert "60.0" in page  # the day's instance-seconds
    assert admin_client.get("/admin/usage/usagerecord/daily/?days=nonsense").status_code == 200

"""The test databases' flush (tests/conftest.py, _flush_by_delete): DELETE in one transaction empties every table,
rows that reference each other included, where Django's flush issued one TRUNCATE."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.tenants.models import ApiKey, Tenant
from controlplane.tenants.services import tenant_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the DELETE flush is Postgres' (make test runs on it)")
def test_a_flush_deletes_rows_that_reference_each_other_and_truncates_nothing():
    tenant, _ = tenant_create(name="flushed")  # a tenant and its key (a foreign key to it)
    assert ApiKey.objects.filter(tenant=tenant).exists()
    with CaptureQueriesContext(connection) as queries:
        # As a transactional test's teardown calls it (TransactionTestCase._fixture_teardown).
        call_command("flush", verbosity=0, interactive=False, reset_sequences=False)
    statements = [query["sql"] for query in queries.captured_queries]
    assert not [sql for sql in statements if "TRUNCATE" in sql.upper()]
    assert any(sql.upper().startswith("DELETE FROM") for sql in statements)
    assert not Tenant.objects.exists() and not ApiKey.objects.exists()

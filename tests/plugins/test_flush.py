"""The test databases' flush (tests/plugins/flush.py): DELETE in one transaction empties every table, rows that reference
each other included, where Django's flush issued one TRUNCATE; the rows post_migrate makes are inserted again as
the first flush's post_migrate made them, the same rows Django's own post_migrate makes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.tenants.models import ApiKey, Tenant
from controlplane.tenants.services import tenant_create
from tests.plugins import flush

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


def _post_migrate_rows() -> dict[str, set[tuple[str, ...]]]:
    """What post_migrate makes, by natural key (a real run gives new ids)."""
    return {
        "content types": set(ContentType.objects.values_list("app_label", "model")),
        "permissions": set(Permission.objects.values_list("content_type__app_label", "codename", "name")),
        "groups": set(Group.objects.values_list("name")),
        "group permissions": set(Group.objects.values_list("name", "permissions__codename")),
    }


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the replay is Postgres' (make test runs on it)")
def test_a_flush_puts_back_what_djangos_post_migrate_makes_without_running_it():
    call_command("flush", verbosity=0, interactive=False, reset_sequences=False)  # the first of this database, maybe
    with CaptureQueriesContext(connection) as queries:
        call_command("flush", verbosity=0, interactive=False, reset_sequences=False)
    replayed = _post_migrate_rows()
    # Put back by INSERTs alone: no lookups of content types or permissions, as post_migrate's handlers make.
    reads = [query["sql"] for query in queries.captured_queries if query["sql"].upper().startswith("SELECT")]
    assert not reads
    assert len([query for query in queries.captured_queries if query["sql"].startswith("INSERT")]) >= 3

    call_command("flush", verbosity=0, interactive=False, reset_sequences=False, inhibit_post_migrate=True)
    assert not ContentType.objects.exists()
    flush.emit_post_migrate(0, False, "default")
    made = _post_migrate_rows()
    assert made == replayed
    assert len(made["permissions"]) > 100 and ("console", "view_modelsample") in {
        (app, codename) for app, codename, _ in made["permissions"]
    }

"""The order in which a batch's writers lock rows (batches/services.py). A cancel or a finalizer updates the batch
row and then, at its commit, checks its foreign keys, which takes KEY SHARE on the tenant's row. Validation's
verdict locks both too (the tenant row for admission, batches/intake/admission.py): it must take the batch row
first, or a cancel of a still-validating batch deadlocks with it (found by the chaos suite's tenant-abuse
scenario as a 503, 2026-12-03). The test holds the batch row the way a cancel's UPDATE does, lets the verdict
run into it, then takes the tenant row the way the cancel's commit does: that must not wait on validation."""

from __future__ import annotations

import threading

import pytest

from controlplane.batches import services
from controlplane.batches.intake import verdict
from controlplane.batches.models import Batch, BatchStatus
from controlplane.core.messaging import dispatch
from controlplane.tenants.models import Tenant
from tests.support.batches import jsonl, tensor_line, upload
from tests.support.row_locks import GIVE_UP_SECONDS, connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.row_locks]


def _waiting_on_a_lock(observer) -> int:
    return observer.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()[0]


def test_validation_takes_the_batch_row_before_the_tenant_row_as_a_cancel_does(tenant, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    file = upload(tenant, jsonl([tensor_line(f"r-{i}", [[float(i), 1.0]]) for i in range(3)]))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")

    # Validation stops after reading the file, before its verdict's transaction, until the "cancel" holds the row.
    read, held = threading.Event(), threading.Event()
    validate_input = verdict.validate_input

    def reading_then_waiting(*args, **kwargs):
        result = validate_input(*args, **kwargs)
        read.set()
        assert held.wait(GIVE_UP_SECONDS)
        return result

    monkeypatch.setattr(verdict, "validate_input", reading_then_waiting)
    errors: list[BaseException] = []

    def validate() -> None:
        from django.db import connection

        try:
            services.batch_validate(batch_id=batch.id)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    canceller, observer = connect(), connect(autocommit=True)
    thread = threading.Thread(target=validate)
    try:
        thread.start()
        assert read.wait(GIVE_UP_SECONDS), "validation did not read the file"
        # A cancel's UPDATE of the batch row (it changes no key: FOR NO KEY UPDATE).
        canceller.execute(f"SELECT id FROM {Batch._meta.db_table} WHERE id = %s FOR NO KEY UPDATE", (batch.id,))
        held.set()
        # The verdict runs into that row (with the old order, it holds the tenant row FOR UPDATE by then).
        for _ in range(int(GIVE_UP_SECONDS / 0.01)):
            if _waiting_on_a_lock(observer):
                break
            thread.join(0.01)
        assert _waiting_on_a_lock(observer), "validation's verdict did not wait for the held batch row"
        # The cancel's commit: its foreign-key check on the tenant row. Postgres reports a deadlock after its
        # deadlock_timeout (1 s); the lock timeout only bounds a wait that is not one.
        canceller.execute("SET LOCAL lock_timeout = '10s'")
        canceller.execute(f"SELECT 1 FROM {Tenant._meta.db_table} WHERE id = %s FOR KEY SHARE", (tenant.id,))
        canceller.rollback()  # the cancel did not happen after all: validation goes on
        thread.join(GIVE_UP_SECONDS)
        assert not thread.is_alive(), f"validation did not finish within {GIVE_UP_SECONDS} s"
    finally:
        held.set()
        canceller.rollback()
        thread.join(GIVE_UP_SECONDS)
        canceller.close()
        observer.close()
    assert not errors, errors
    assert Batch.objects.get(id=batch.id).status == BatchStatus.IN_PROGRESS

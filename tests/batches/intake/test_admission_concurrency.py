"""Two validations of one tenant at the same moment, on Postgres, in two threads with their own connections:
the enqueued-token check runs under the tenant row lock until the batch starts, so of two
batches that each fit the limit alone but not together, exactly one starts and the other fails with
token_limit_exceeded. Without the lock both read the other's tokens as not yet enqueued and both start."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus
from controlplane.core.messaging import dispatch
from controlplane.tenants.models import Tenant
from tests.support.batches import embedding_line, jsonl, upload

pytestmark = pytest.mark.django_db(transaction=True)
# Where the race would be lost: between a validation's check and its commit. Held open this long, so the other
# thread's check falls inside it whenever the two are not ordered by the lock.
CHECK_TO_COMMIT_SECONDS = 0.5


def _batch(tenant) -> Batch:
    content = jsonl([embedding_line(f"r{i}", "a sentence of some forty characters long") for i in range(10)])
    file = upload(tenant, content)
    return services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )


def test_two_concurrent_validations_cannot_both_pass_a_token_limit_only_one_fits(tenant, monkeypatch, settings):
    assert connection.vendor == "postgresql"  # row locks are the point; SQLite serializes writers anyway
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.VALIDATION_MAX_PER_TENANT = 2  # both validate at once (batches/intake/turns.py)
    first, second = _batch(tenant), _batch(tenant)
    # Each batch's estimated tokens: 10 lines × (40 // 4 + 2). One fits, two do not.
    Tenant.objects.filter(id=tenant.id).update(max_enqueued_tokens=120 + 60)

    real_admit = services.batch_admit_validated
    checked: list[float] = []

    def slow_admit(**kwargs):
        verdict = real_admit(**kwargs)
        checked.append(time.monotonic())
        time.sleep(CHECK_TO_COMMIT_SECONDS)
        return verdict

    monkeypatch.setattr(services, "batch_admit_validated", slow_admit)
    start = threading.Barrier(2)
    failures: list[Exception] = []

    def validate(batch_id: str) -> None:
        try:
            start.wait(timeout=30)
            services.batch_validate(batch_id=batch_id)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread; a thread's exception is otherwise lost
            failures.append(exc)
        finally:
            connections.close_all()  # this thread's own connection

    threads = [threading.Thread(target=validate, args=(b.id,)) for b in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    statuses = sorted(Batch.objects.filter(id__in=[first.id, second.id]).values_list("status", "errors"), key=str)
    assert [s for s, _ in statuses] == sorted([BatchStatus.IN_PROGRESS, BatchStatus.FAILED]), statuses
    (errors,) = [e for s, e in statuses if s == BatchStatus.FAILED]
    assert [e["code"] for e in errors["data"]] == ["token_limit_exceeded"]
    assert "~120 tokens would bring the tenant's enqueued tokens to ~240" in errors["data"][0]["message"]
    # The second check came after the first commit: they were ordered by the lock, not by luck.
    assert len(checked) == 2 and checked[1] - checked[0] >= CHECK_TO_COMMIT_SECONDS * 0.9

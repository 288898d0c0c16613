"""A lost database connection mid-validation is retried by the task within seconds, not left to the rescuer's
20-minute deadline on ``validating`` (found by the chaos suite: Postgres restarted while a batch validated)."""

from __future__ import annotations

import pytest
from celery.exceptions import Retry
from django.db import OperationalError

from controlplane.batches import services, tasks
from controlplane.batches.results import rerun_input


def test_a_lost_connection_retries_the_validation_with_backoff(monkeypatch):
    calls: list[str] = []

    def lost(*, batch_id: str, waiting: bool = False) -> None:
        calls.append(batch_id)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(rerun_input, "rerun_input_ready", lambda *, batch_id: True)
    monkeypatch.setattr(services, "batch_validate", lost)
    retried: list[dict] = []

    def retry(self, *args, **kwargs):  # what Celery's autoretry asks for: a later run of the same message
        retried.append(kwargs)
        raise Retry("retry", kwargs.get("exc"))

    monkeypatch.setattr(tasks.batch_validate_task, "retry", retry.__get__(tasks.batch_validate_task))
    with pytest.raises(Retry):
        tasks.batch_validate_task.run("batch_x")
    assert calls == ["batch_x"]
    assert len(retried) == 1 and retried[0]["countdown"] == 2  # the first of 2, 4, 8, 16, 32 s
    assert isinstance(retried[0]["exc"], OperationalError)
    assert tasks.batch_validate_task.max_retries == tasks.VALIDATE_DB_RETRIES


def test_other_errors_are_not_retried_by_the_task(monkeypatch):
    monkeypatch.setattr(rerun_input, "rerun_input_ready", lambda *, batch_id: True)
    monkeypatch.setattr(
        services, "batch_validate", lambda *, batch_id, waiting=False: (_ for _ in ()).throw(KeyError("x"))
    )
    with pytest.raises(KeyError):
        tasks.batch_validate_task.run("batch_x")

"""Validation's turn (batches/intake/turns.py): at most VALIDATION_MAX_PER_TENANT batches of one tenant validate at
once; one past the limit gives its place back (its message goes round, later, through the outbox), so another
tenant's validation behind it runs first; a batch waiting its turn is neither lost, nor validated twice, nor taken
for lost by the rescuer. The task is called directly; the database is the judge."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.intake import validation_rescue
from controlplane.batches.intake.turns import WAIT, WAIT_SECONDS, validation_turn_take
from controlplane.batches.intake.validation_deadline import attempt_stop_at
from controlplane.batches.models import Batch, BatchEvent, BatchStatus
from controlplane.core.messaging import dispatch
from tests.batches.test_lifecycle import _create
from tests.support.batches import embedding_line

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(settings, monkeypatch) -> list[tuple[str, list, dict]]:
    messages: list[tuple[str, list, dict]] = []
    monkeypatch.setattr(
        dispatch, "send", lambda task_name, args, **options: messages.append((task_name, args, options))
    )
    settings.VALIDATION_MAX_PER_TENANT = 1
    settings.BATCH_VALIDATION_DEADLINE_SECONDS = 60
    return messages


def _batch(tenant) -> Batch:
    return _create(tenant, [embedding_line(f"r{i}", f"text {i}") for i in range(3)])


def _status(batch: Batch) -> str:
    return Batch.objects.get(id=batch.id).status


def test_a_tenant_at_its_limit_waits_while_another_tenants_batch_validates(tenant, other_tenant, sent):
    first, second, theirs = _batch(tenant), _batch(tenant), _batch(other_tenant)
    sent.clear()
    assert validation_turn_take(batch_id=first.id) == 1  # the tenant's first batch is validating
    # The queue holds [second, theirs]: second finds its tenant at the limit and goes to the back, later.
    services.batch_validate(batch_id=second.id)
    assert _status(second) == BatchStatus.VALIDATING
    assert Batch.objects.get(id=second.id).validation_attempt == 0  # no attempt taken: nothing to supersede
    assert sent == [(dispatch.VALIDATE, [second.id, True], {"countdown": WAIT_SECONDS})]
    services.batch_validate(batch_id=theirs.id)  # the other tenant's, behind it, runs at once
    assert _status(theirs) == BatchStatus.IN_PROGRESS
    # second comes round while first still validates: it waits again.
    services.batch_validate(batch_id=second.id, waiting=True)
    assert _status(second) == BatchStatus.VALIDATING
    # first finishes (its message, delivered again, takes the next attempt) and hands the turn to second at once.
    sent.clear()
    services.batch_validate(batch_id=first.id)
    assert _status(first) == BatchStatus.IN_PROGRESS
    assert (dispatch.VALIDATE, [second.id, True], {}) in sent
    services.batch_validate(batch_id=second.id, waiting=True)  # the hand-off
    second = Batch.objects.get(id=second.id)
    assert second.status == BatchStatus.IN_PROGRESS and second.validation_attempt == 1


def test_of_two_waiting_messages_of_one_batch_the_second_drops_out(tenant, sent):
    first, second = _batch(tenant), _batch(tenant)
    assert validation_turn_take(batch_id=first.id) == 1
    assert validation_turn_take(batch_id=second.id) == WAIT  # its own message goes round
    Batch.objects.filter(id=first.id).update(status=BatchStatus.IN_PROGRESS)  # first ended
    assert validation_turn_take(batch_id=second.id, waiting=True) == 1  # the hand-off takes the turn
    # Its own message, round again, must not supersede the attempt the hand-off began.
    assert validation_turn_take(batch_id=second.id, waiting=True) is None
    assert Batch.objects.get(id=second.id).validation_attempt == 1
    # A redelivery (not a waiting message: the worker that ran attempt 1 was lost) takes a new attempt.
    assert validation_turn_take(batch_id=second.id) == 2


def test_the_limit_is_a_setting(tenant, sent, settings):
    settings.VALIDATION_MAX_PER_TENANT = 2
    first, second, third = _batch(tenant), _batch(tenant), _batch(tenant)
    assert validation_turn_take(batch_id=first.id) == 1
    assert validation_turn_take(batch_id=second.id) == 1
    assert validation_turn_take(batch_id=third.id) == WAIT


def test_a_give_back_is_durable_when_the_broker_refuses_it(tenant, sent, monkeypatch):
    first, second = _batch(tenant), _batch(tenant)
    validation_turn_take(batch_id=first.id)

    def refuse(task_name, args, **options):
        raise ConnectionError("broker down")

    monkeypatch.setattr(dispatch, "send", refuse)
    assert validation_turn_take(batch_id=second.id) == WAIT
    # The outbox row stays for the relay: the waiting batch keeps its message.
    assert (
        list(dispatch.OutboxMessage.objects.values_list("task_name", "args")).count(
            (dispatch.VALIDATE, [second.id, True])
        )
        == 1
    )


def test_a_batch_waiting_its_turn_is_not_taken_for_lost(tenant, sent):
    first, second = _batch(tenant), _batch(tenant)
    validation_turn_take(batch_id=first.id)
    past = timezone.now() - timedelta(seconds=600)
    Batch.objects.filter(id__in=[first.id, second.id]).update(created_at=past, validation_started_at=past)
    BatchEvent.objects.filter(batch_id__in=[first.id, second.id]).update(created_at=past)
    Batch.objects.filter(id=second.id).update(validation_started_at=None)
    assert validation_turn_take(batch_id=second.id) == WAIT  # a give-back, just now
    # first's turn is older than the deadline (its worker died): retried; second, which just gave back, is not.
    assert validation_rescue.batches_validation_rescue() == [first.id]
    Batch.objects.filter(id=second.id).update(validation_waiting_at=past)  # its messages stopped coming round
    assert validation_rescue.batches_validation_rescue() == [second.id]


def test_the_attempts_deadline_counts_from_its_turn_not_from_create(tenant, sent):
    batch = _batch(tenant)
    past = timezone.now() - timedelta(seconds=600)
    Batch.objects.filter(id=batch.id).update(created_at=past)
    BatchEvent.objects.filter(batch_id=batch.id).update(created_at=past)
    assert validation_turn_take(batch_id=batch.id) == 1  # after ten minutes of waiting
    assert attempt_stop_at(batch_id=batch.id, created_at=past) > timezone.now()
    # A redelivered message of the running batch takes the next attempt but keeps the clock.
    started = Batch.objects.get(id=batch.id).validation_started_at
    assert validation_turn_take(batch_id=batch.id) == 2
    assert Batch.objects.get(id=batch.id).validation_started_at == started


def test_two_claims_of_one_tenant_at_once_give_one_turn(tenant, sent):
    assert connection.vendor == "postgresql"  # row locks are the point; SQLite serializes writers anyway
    batches = [_batch(tenant) for _ in range(4)]
    results: dict[str, object] = {}
    barrier = threading.Barrier(len(batches))

    def claim(batch_id: str) -> None:
        try:
            barrier.wait()
            results[batch_id] = validation_turn_take(batch_id=batch_id)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(b.id,)) for b in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values(), key=str) == [1, WAIT, WAIT, WAIT]
    validating = Batch.objects.filter(tenant=tenant, validation_started_at__isnull=False)
    assert validating.count() == 1

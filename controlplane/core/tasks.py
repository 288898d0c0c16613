"""Beat tasks of the core app."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.core.http.idempotency import idempotency_records_prune
from controlplane.core.messaging import dispatch


@shared_task(name="core.idempotency_records_prune")
def idempotency_records_prune_task() -> int:
    return idempotency_records_prune(now=timezone.now())


@shared_task(name="core.outbox_relay")
def outbox_relay_task() -> int:
    return dispatch.outbox_relay()

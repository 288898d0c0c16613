"""Beat tasks of the core app."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.core.idempotency import idempotency_records_prune


@shared_task(name="core.idempotency_records_prune")
def idempotency_records_prune_task() -> int:
    return idempotency_records_prune(now=timezone.now())

"""Celery tasks of the files app: thin wrappers over its services (beat's schedule, settings)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.files import retention


# The name predates the move into files: kept, so beat and workers of the last release still agree on it
# (deploy/upgrade/contract.json).
@shared_task(name="batches.files_expire")
def files_expire_task() -> int:
    return len(retention.files_expire(now=timezone.now()))

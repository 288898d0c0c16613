"""Celery tasks of the files app: thin wrappers over its services (beat's schedule, settings)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.files import retention


# Named in batches' namespace, the name beat and workers of the previous release send and run during a rolling
# upgrade (deploy/upgrade/contract.json).
@shared_task(name="batches.files_expire")
def files_expire_task() -> int:
    return len(retention.files_expire(now=timezone.now()))

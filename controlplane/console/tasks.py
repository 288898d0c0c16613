"""Celery tasks of the console: beat's dashboard samples (CONSOLE_SAMPLES_INTERVAL_SECONDS)."""

from __future__ import annotations

from celery import shared_task

from controlplane.console.samples import samples_take


@shared_task(name="console.samples_take")
def samples_take_task() -> int:
    return samples_take()

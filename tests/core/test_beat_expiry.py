"""Beat's periodic messages expire (settings._periodic): a control worker slower than beat discards the stale
ones instead of working through a backlog of housekeeping while a batch's validation waits behind it."""

from __future__ import annotations

from celery.beat import ScheduleEntry
from django.conf import settings

from controlplane.celery import app


def test_every_periodic_message_expires_after_one_to_two_periods_five_seconds_at_least():
    assert settings.CELERY_BEAT_SCHEDULE
    for name, spec in settings.CELERY_BEAT_SCHEDULE.items():
        # As beat reads the entry: its options go to apply_async with every message it sends.
        entry = ScheduleEntry(
            name=name, task=spec["task"], schedule=spec["schedule"], options=spec.get("options"), app=app
        )
        period = entry.schedule.run_every.total_seconds()
        expires = entry.options.get("expires")
        assert expires is not None, f"{name}: its messages never expire"
        assert period <= expires <= max(2 * period, 5.0), f"{name}: expires {expires} for a {period} s period"

"""`manage.py samples_take`: store one tick of dashboard samples now (beat does it every
CONSOLE_SAMPLES_INTERVAL_SECONDS; this is for a first look, or a host without beat)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from controlplane.console.samples import samples_take


class Command(BaseCommand):
    help = "Store one tick of dashboard samples (queue, throughput, latency, utilisation) now."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"{samples_take()} samples stored")

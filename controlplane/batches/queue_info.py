"""A running batch's place in its model's queue, as the tenant sees it on the Batch object. The scheduler ranks
the queue and sits a floor above batches (the import-linter contract), so it registers its ranking here at
start-up (scheduling/apps.py) and the batch views ask through this port."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from controlplane.batches.models import Batch

# Batches → {batch id: queue fields} for those of them that wait in a queue.
QueueInfo = Callable[[Iterable[Batch]], dict[str, dict[str, Any]]]

_provider: QueueInfo | None = None


def queue_info_register(provider: QueueInfo) -> None:
    global _provider
    _provider = provider


def batches_queue_info(batches: Iterable[Batch]) -> dict[str, dict[str, Any]]:
    # Without a scheduler installed there is no queue to show: the Batch objects go out without positions.
    return _provider(batches) if _provider is not None else {}

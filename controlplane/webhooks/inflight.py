"""Caps on webhook calls in flight in this process, so one endpoint or tenant cannot hold every thread.

The webhooks worker runs Celery's thread pool and the web tier gunicorn's gthread workers: a thread that
waits on a receiver is a thread nobody else gets, for up to the attempt's deadline. The caps are per process
because threads are: each process keeps room for other tenants whatever one tenant's receivers do. A call
over a cap is not queued here (that would hold a thread too): the caller defers it or answers 429."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


class InflightCaps:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    @contextmanager
    def hold(self, caps: Mapping[str, int]) -> Iterator[bool]:
        """Count one call against each key for the block, if every key is under its cap; yields whether it
        is (False: nothing was counted and the caller must not make the call)."""
        with self._lock:
            admitted = all(self._counts[key] < cap for key, cap in caps.items())
            if admitted:
                for key in caps:
                    self._counts[key] += 1
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    for key in caps:
                        self._counts[key] -= 1
                        if not self._counts[key]:
                            del self._counts[key]

    def count(self, key: str) -> int:
        with self._lock:
            return self._counts[key]


# Delivery attempts of the webhooks worker (attempts.py) and test calls of the web tier (services.py).
DELIVERIES = InflightCaps()
TESTS = InflightCaps()

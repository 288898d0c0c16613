"""The lease keeper: a background thread that renews a lease while its holder works. Shards (batches/run/
execution.py) and dispatch slots (scheduling/runner.py) hold leases as short as SHARD_LEASE_SECONDS, so a dead
worker's work is taken over within seconds; the keeper is what lets a live one hold a lease for as long as
its work takes. It lives beside the shards (shards.py) because its cadence derives from the shard lease."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)


def lease_renew_interval() -> float:
    """Renew every second (a quarter of a short lease at most): a lease survives a few missed renewals."""
    return max(0.2, min(1.0, settings.SHARD_LEASE_SECONDS / 4))


class LeaseKeeper:
    """Renews a lease from a background thread for as long as the holder works, whatever it is doing
    (reading its input, waiting for a model to load, a slow Triton call, uploading its part), so leases
    can be short. ``lost`` is set once a renewal matched nothing: the holder must stop and publish
    nothing. A database error is not a lost lease: the next tick tries again, and if the database stays
    away the lease simply expires (the rescuer treats that as the infrastructure fault it is)."""

    def __init__(self, renew: Callable[[], bool], *, name: str) -> None:
        self.name = name
        self.lost = threading.Event()
        self._renew = renew
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = lease_renew_interval()
        try:
            while not self._stop.wait(interval):
                try:
                    renewed = self._renew()
                except DatabaseError:
                    logger.warning("%s: renewing the lease failed; retrying", self.name, exc_info=True)
                    connection.close()  # reconnect on the next tick
                    continue
                if not renewed:
                    self.lost.set()
                    return
        finally:
            connection.close()  # this thread's own connection

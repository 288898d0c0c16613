"""The per-tenant storage quota: bytes of the tenant's stored files, uploads and batch results alike, plus the
expected results of its running batches.

Every tenant has one: its own (the admin), else the service default TENANT_STORAGE_QUOTA_BYTES (100 GiB; 0 is
unlimited). An upload is checked three times, each as early as it can be known: against the request's
Content-Length before the body is read, against the bytes received while it streams in (a chunked
upload), and, authoritatively, in the transaction that creates its row with the tenant row locked, so
two concurrent uploads cannot both slip under the quota (the stored blob is deleted when that fails).
A file larger than the whole quota is a 413; one that only does not fit beside the tenant's other
files is a 429 naming the limit.

A batch's results are reserved when its validation succeeds: the expected output size (its endpoint kind's
estimate, e.g. embeddings: lines × dimensions; generation: per line, choices and logprobs counted) is checked against the room left, under the tenant row lock, and
held as a StorageReservation until the batch ends, when its result files (written in that same transaction)
count instead. A batch that does not fit fails validation (storage_quota_exceeded), before any more of it runs;
results are never refused once it runs, so real output larger than the estimate can take a tenant over its
quota until it deletes files (or they expire).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Sum

from controlplane.core.http.errors import PayloadTooLarge, QuotaExceeded
from controlplane.files.models import File, StorageReservation
from controlplane.tenants.models import Tenant

CODE = "storage_quota_exceeded"
# Stored bytes free up only when the tenant deletes files or they expire, never by waiting alone; a
# minute is a fair poll interval, and the SDK is told not to retry by itself.
RETRY_AFTER_SECONDS = 60
_NO_SDK_RETRY = {"x-should-retry": "false"}


def storage_used(*, tenant_id: int) -> int:
    """Bytes of the tenant's stored files (expired ones count until beat has deleted them) and of the results
    reserved for its running batches."""
    stored = File.objects.filter(tenant_id=tenant_id).aggregate(total=Sum("bytes"))["total"]
    reserved = StorageReservation.objects.filter(tenant_id=tenant_id).aggregate(total=Sum("bytes"))["total"]
    return int(stored or 0) + int(reserved or 0)


@dataclass(frozen=True)
class StorageRoom:
    """A tenant's quota and usage at one moment; ``quota`` None is unlimited."""

    quota: int | None
    used: int

    def read_limit(self, limit: int) -> int:
        """How many bytes of an upload are worth reading: past the quota the answer is a 413 anyway."""
        return limit if self.quota is None else min(limit, self.quota)

    def check(self, incoming: int) -> None:
        """Raise 413 when ``incoming`` bytes alone exceed the quota, 429 when they do not fit beside
        what is stored."""
        quota = self.quota
        if quota is None:
            return
        if incoming > quota:
            raise PayloadTooLarge(
                f"The file is {incoming} bytes, larger than the tenant's whole storage quota of {quota} bytes; "
                "split it, or ask for a larger quota.",
                param="file",
                code=CODE,
            )
        if self.used + incoming > quota:
            raise QuotaExceeded(
                f"Storing this {incoming}-byte file would bring the tenant's stored files to "
                f"{self.used + incoming} bytes, over its storage quota of {quota} bytes ({self.used} bytes "
                "already stored); delete files you no longer need (or let them expire) and retry.",
                param="file",
                code=CODE,
                limit="storage_quota_bytes",
                value=quota,
                current=self.used,
                requested=incoming,
                retry_after=RETRY_AFTER_SECONDS,
                headers=_NO_SDK_RETRY,
            )


def storage_room(*, tenant: Tenant) -> StorageRoom:
    """The tenant's quota and, only when it has one, its usage (no sum over its files otherwise)."""
    quota = tenant.storage_quota
    return StorageRoom(quota=quota, used=0 if quota is None else storage_used(tenant_id=tenant.id))


def storage_quota_enforce(*, tenant_id: int, incoming: int) -> None:
    """The authoritative check, inside the transaction that creates the file's row: locks the tenant row
    (as batch create does for its quotas), so concurrent uploads are counted one after the other."""
    storage_room(tenant=Tenant.objects.select_for_update().get(id=tenant_id)).check(incoming)


def storage_reserve_refusal(*, tenant: Tenant, expected: int) -> dict[str, Any] | None:
    """The batch error entry when ``expected`` bytes of results do not fit beside what the tenant stores and
    has reserved, else None. ``tenant`` must be the locked row, held until ``storage_reserve`` commits."""
    quota = tenant.storage_quota
    if quota is None:
        return None
    used = storage_used(tenant_id=tenant.id)
    if used + expected <= quota:
        return None
    return {
        "code": CODE,
        "param": None,
        "line": None,
        "message": (
            f"The batch's results are expected to take ~{expected} bytes, which would bring the tenant's stored "
            f"and reserved bytes to {used + expected}, over its storage quota of {quota} bytes ({used} already "
            "used); delete files you no longer need (or let them expire), or split the file."
        ),
    }


def storage_reserve(*, tenant_id: int, batch_id: str, expected: int) -> None:
    """Hold ``expected`` bytes for a batch that just started, in the transaction that starts it."""
    StorageReservation.objects.update_or_create(batch_id=batch_id, defaults={"tenant_id": tenant_id, "bytes": expected})


def storage_reservation_release(*, batch_id: str) -> None:
    """In the transaction that ends the batch: its result files, saved in it, count from now on."""
    StorageReservation.objects.filter(batch_id=batch_id).delete()

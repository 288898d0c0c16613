"""The per-tenant storage quota: bytes of the tenant's stored files, uploads and batch results alike.

An upload is checked three times, each as early as it can be known: against the request's
Content-Length before the body is read, against the bytes received while it streams in (a chunked
upload), and, authoritatively, in the transaction that creates its row with the tenant row locked, so
two concurrent uploads cannot both slip under the quota (the stored blob is deleted when that fails).
A file larger than the whole quota is a 413; one that only does not fit beside the tenant's other
files is a 429 naming the limit. Batch results are never refused: a finished batch always gets its
files, which may take a tenant over its quota until it deletes some (or they expire).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Sum

from controlplane.core.errors import PayloadTooLarge, QuotaExceeded
from controlplane.files.models import File
from controlplane.tenants.models import Tenant

CODE = "storage_quota_exceeded"
# Stored bytes free up only when the tenant deletes files or they expire, never by waiting alone; a
# minute is a fair poll interval, and the SDK is told not to retry by itself.
RETRY_AFTER_SECONDS = 60
_NO_SDK_RETRY = {"x-should-retry": "false"}


def storage_used(*, tenant_id: int) -> int:
    """Bytes of the tenant's stored files (expired ones count until beat has deleted them)."""
    total = File.objects.filter(tenant_id=tenant_id).aggregate(total=Sum("bytes"))["total"]
    return int(total or 0)


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
    quota = tenant.storage_quota_bytes
    return StorageRoom(quota=quota, used=0 if quota is None else storage_used(tenant_id=tenant.id))


def storage_quota_enforce(*, tenant_id: int, incoming: int) -> None:
    """The authoritative check, inside the transaction that creates the file's row: locks the tenant row
    (as batch create does for its quotas), so concurrent uploads are counted one after the other."""
    quota = Tenant.objects.select_for_update().values_list("storage_quota_bytes", flat=True).get(id=tenant_id)
    if quota is not None:
        StorageRoom(quota=quota, used=storage_used(tenant_id=tenant_id)).check(incoming)

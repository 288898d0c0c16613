"""What the batch pipeline tells files about the files and blobs it still needs (files/in_use.py).

Files sit below the pipeline and never read its tables; this ``FileUser``, registered when Django starts
(batches/apps.py), answers for it: a non-terminal batch still reads its input file (so neither a delete nor
expiry takes it), and the shard rows name the part and columns blobs under ``parts/`` (so the storage
collector keeps them, and an empty part directory of a running batch)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from controlplane.batches.models import ACTIVE_STATUSES, Batch, Shard

PARTS_PREFIX = "parts"
_SHARD_BLOB_FIELDS = ("part_name", "columns_name")


class BatchFileUse:
    blob_prefixes: tuple[str, ...] = (PARTS_PREFIX,)

    def file_in_use(self, *, file_id: str, tenant_id: int) -> str | None:
        active = (
            Batch.objects.filter(tenant_id=tenant_id, input_file_id=file_id, status__in=ACTIVE_STATUSES)
            .only("id", "status")
            .first()
        )
        if active is None:
            return None
        return (
            f"File {file_id} is the input of batch {active.id}, which is still {active.status}; "
            "cancel the batch or wait for it to finish before deleting the file."
        )

    def files_in_use(self) -> QuerySet[Any, Any]:
        return Batch.objects.filter(status__in=ACTIVE_STATUSES).values("input_file_id")

    def blobs_named(self, names: list[str], *, directory: str | None) -> set[str]:
        """Shard.part_name has no index of its own: a part directory's lookup is narrowed to its batch's
        shards (indexed)."""
        named: set[str] = set()
        for field in _SHARD_BLOB_FIELDS:
            shards = Shard.objects.filter(**{f"{field}__in": names})
            if directory is not None and directory.startswith(f"{PARTS_PREFIX}/"):
                shards = shards.filter(batch_id=directory.removeprefix(f"{PARTS_PREFIX}/"))
            named.update(shards.values_list(field, flat=True))
        return named

    def directory_in_use(self, directory: str) -> bool:
        """A batch's part directory, while the batch runs: a new attempt writes into it."""
        if not directory.startswith(f"{PARTS_PREFIX}/"):
            return True  # not a directory the pipeline knows: never removed
        batch_id = directory.removeprefix(f"{PARTS_PREFIX}/")
        return Batch.objects.filter(id=batch_id, status__in=ACTIVE_STATUSES).exists()

from __future__ import annotations

from django.db import models

from controlplane.core.models import new_public_id
from controlplane.tenants.models import Tenant


def new_file_id() -> str:
    return new_public_id("file-")


class File(models.Model):
    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(primary_key=True, max_length=40, default=new_file_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="files")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=32, choices=Purpose.choices)
    bytes = models.PositiveBigIntegerField()
    storage_name = models.CharField(max_length=500)
    # Non-blank lines, counted while the upload streamed: the enqueued-lines quota is checked at
    # batch create from it, before validation reads the file. Null for files stored before counting.
    line_count = models.PositiveBigIntegerField(null=True, blank=True)
    # A result file's seek points, [[lines before, byte offset], ...] about every LINE_INDEX_STEP_BYTES, written
    # by finalization: the results endpoint's cursor (a line number) seeks to the last point at or before it
    # instead of reading the file from its first byte. Null: none (uploads, files stored before the index).
    line_offsets = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # OpenAI's expires_after / a batch's output_expires_after (anchor: created_at). Past it the file is
    # gone for the tenant and beat deletes it (files/retention.files_expire); null keeps it until deleted.
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        indexes = (
            models.Index(fields=["tenant", "created_at"]),
            # The storage garbage collector asks which listed blobs a row still refers to.
            models.Index(fields=["storage_name"], name="files_file_storage_name_idx"),
        )

    def __str__(self) -> str:
        return f"{self.id} {self.filename}"


class StorageReservation(models.Model):
    """The expected size of a running batch's results, held against its tenant's storage quota from validation
    until the batch ends (then its result files, if any, count instead; files/quota.py). By batch id, not
    foreign key: files sit below batches."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="storage_reservations")
    batch_id = models.CharField(max_length=40, unique=True)
    bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.batch_id}: {self.bytes} bytes"

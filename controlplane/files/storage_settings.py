"""The ``STORAGES["default"]`` entry for S3-compatible storage, from typed values: settings.py reads them
from the environment, and the S3 tests point the same entry at their own server."""

from __future__ import annotations

from typing import Any

from boto3.s3.transfer import TransferConfig


def s3_storage_entry(
    *,
    bucket: str,
    endpoint_url: str | None,
    region: str | None,
    prefix: str,
    chunk_bytes: int,
    concurrency: int,
) -> dict[str, Any]:
    """django-storages' S3Storage, with uploads that hold at most (concurrency + 1) × chunk_bytes in
    memory whatever the file's size: s3transfer reads each part of a file object into memory, up to
    ``max_in_memory_upload_chunks`` of them plus one per thread still reading the source."""
    transfer = TransferConfig(
        multipart_threshold=chunk_bytes,
        multipart_chunksize=chunk_bytes,
        max_concurrency=concurrency,
    )
    transfer.max_in_memory_upload_chunks = concurrency
    transfer.max_submission_concurrency = 1
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": endpoint_url,
            "region_name": region,
            "location": prefix,
            # files/storage.blob_save wants to see a name clash (a bug), not silently overwrite a blob.
            "file_overwrite": False,
            "transfer_config": transfer,
        },
    }

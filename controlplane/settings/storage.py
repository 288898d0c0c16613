"""Storage settings: local directory by default; STORAGE_BACKEND=s3 switches to django-storages' S3 backend on
any S3-compatible store (S3_ENDPOINT_URL for MinIO/Ceph/...). Credentials come from boto3's own chain
(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an instance or pod role), never from settings.

``s3_storage_entry`` builds the ``STORAGES["default"]`` entry from typed values: this module reads them from
the environment, and the S3 tests point the same entry at their own server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.core.env import env_choice, env_int, env_str
from controlplane.settings.paths import VAR_DIR


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
    # Imported here: boto3 takes ~0.2 s to import, and only an S3 deployment (or its tests) needs it.
    from boto3.s3.transfer import TransferConfig

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
            # Signature V4, which every region accepts; presigned download URLs then carry X-Amz-Expires.
            "signature_version": "s3v4",
        },
    }


MEDIA_ROOT = Path(
    env_str("STORAGE_ROOT", str(VAR_DIR / "storage"), help="The directory of local storage (STORAGE_BACKEND=local).")
)
_backend = env_choice("STORAGE_BACKEND", "local", ("local", "s3"), help="Where files are stored.")
# Read whatever the backend, so that every variable is checked at start-up and listed in the reference.
_s3_bucket = env_str(
    "S3_BUCKET",
    env_str("AWS_STORAGE_BUCKET_NAME", "controlplane", help="The S3 bucket when S3_BUCKET is unset."),
    help="The S3 bucket.",
)
_s3_endpoint_url = env_str("S3_ENDPOINT_URL", "", help="An S3-compatible store's URL (MinIO, Ceph); empty: AWS.")
_s3_region = env_str(
    "S3_REGION", env_str("AWS_DEFAULT_REGION", "", help="The S3 region when S3_REGION is unset."), help="The S3 region."
)
_s3_prefix = env_str("S3_PREFIX", "", help="Key prefix of every object the service stores in the bucket.")
# S3 parts must be ≥ 5 MiB; with 4 in flight an upload holds ~40 MiB of RAM at most.
_s3_chunk_bytes = env_int(
    "S3_TRANSFER_CHUNK_BYTES", 8 * 1024 * 1024, minimum=5 * 1024 * 1024, help="Size of an upload's multipart parts."
)
_s3_concurrency = env_int("S3_TRANSFER_CONCURRENCY", 4, minimum=1, help="Parts of one upload in flight at once.")
if _backend == "s3":
    _default_storage = s3_storage_entry(
        bucket=_s3_bucket,
        endpoint_url=_s3_endpoint_url or None,
        region=_s3_region or None,
        prefix=_s3_prefix,
        chunk_bytes=_s3_chunk_bytes,
        concurrency=_s3_concurrency,
    )
else:
    _default_storage = {"BACKEND": "django.core.files.storage.FileSystemStorage"}
FILE_DOWNLOAD_ACCEL_PREFIX = env_str(
    "FILE_DOWNLOAD_ACCEL_PREFIX",
    "",
    help="Local storage's downloads are sent by nginx from this location (X-Accel-Redirect); empty: by Django.",
)
# On S3, GET /v1/files/{id}/content answers with a redirect to a presigned URL valid this long (0: streamed
# through the web process instead). Only where clients can reach the S3 endpoint themselves (files/views.py).
FILE_DOWNLOAD_PRESIGNED_SECONDS = env_int(
    "FILE_DOWNLOAD_PRESIGNED_SECONDS",
    0,
    minimum=0,
    help="On S3, downloads redirect to a presigned URL valid this long; 0: streamed through the web process.",
)
# Each web process keeps closed shards' rendered result lines up to this many bytes (batches/results/part_cache.py):
# polls from behind a batch's live results do not read the same parts again. 64 MiB per process by default.
RESULTS_PART_CACHE_BYTES = env_int(
    "RESULTS_PART_CACHE_BYTES",
    64 * 1024 * 1024,
    minimum=0,
    help="Closed shards' result lines each web process keeps for live results polls (LRU); 0: none.",
)
STORAGES = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Uploads above this size spill to a temporary file instead of memory; the hard limit is FILE_MAX_BYTES.
FILE_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

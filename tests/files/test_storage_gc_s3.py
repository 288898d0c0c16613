"""The orphan collector (files/storage_gc.py) on the S3 server (tests/files/conftest.py): listing,
modified times and deletes through django-storages' S3 backend, which has no directories."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.files import storage_gc
from controlplane.files.services import file_create
from controlplane.files.storage import blob_save

pytestmark = pytest.mark.django_db


def test_orphans_go_live_and_foreign_blobs_stay(s3_bucket, tenant, settings):
    settings.STORAGE_GC_GRACE_SECONDS = 3600
    content = b'{"a": 1}\n'
    live = file_create(tenant=tenant, content=io.BytesIO(content), filename="in.jsonl", purpose="batch", size=9)
    orphan = blob_save(f"files/{tenant.id}/file-without-a-row", io.BytesIO(content))
    orphan_part = blob_save("parts/batch_gone/000000.attempt1.jsonl", io.BytesIO(content))
    foreign = blob_save("backups/keep-me", io.BytesIO(content))

    assert storage_gc.orphans_collect(now=timezone.now()) == []  # all younger than the grace period
    deleted = storage_gc.orphans_collect(now=timezone.now() + timedelta(hours=2))

    assert sorted(deleted) == sorted([orphan, orphan_part])
    assert s3_bucket.keys() == sorted([live.storage_name, foreign])

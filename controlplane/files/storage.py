"""Blob storage for tenant files, batch parts and results, through Django's storage API (local or S3)."""

from __future__ import annotations

from typing import IO

from django.core.files import File as DjangoFile
from django.core.files.storage import Storage, storages


def blob_storage() -> Storage:
    return storages["default"]


def blob_save(name: str, content: IO[bytes]) -> str:
    """Save under exactly ``name``; callers choose unique names, so a clash is a bug we want to see."""
    storage = blob_storage()
    saved = storage.save(name, DjangoFile(content))
    if saved != name:
        storage.delete(saved)
        raise RuntimeError(f"blob {name!r} already exists")
    return saved


def blob_open(name: str) -> IO[bytes]:
    return blob_storage().open(name, "rb")


def blob_delete(name: str) -> None:
    blob_storage().delete(name)

"""Who still needs a file or a blob. Files sit below the batch pipeline (the import-linter contract): a batch
reading its input must keep that file from being deleted or expired, and the pipeline's own blobs (shard parts)
must survive the storage collector while a row names them, but files cannot import batches. So the layers above
register a ``FileUser`` here at start-up (batches/apps.py); ``file_delete``, ``files_expire`` and the storage
collector ask every registered one."""

from __future__ import annotations

from typing import Any, Protocol

from django.db.models import QuerySet


class FileUser(Protocol):
    """A layer above files that reads tenants' files and keeps blobs of its own in storage."""

    # Top-level storage prefixes whose blobs its own rows name (not File rows): the collector lists them
    # too, and deletes a blob there only when ``blobs_named`` does not claim it.
    blob_prefixes: tuple[str, ...]

    def file_in_use(self, *, file_id: str, tenant_id: int) -> str | None:
        """Why the file may not be deleted now (a sentence for the tenant), or None when it is free."""
        ...

    def files_in_use(self) -> QuerySet[Any, Any]:
        """The ids of every file it still reads, as a one-column query (expiry excludes them in its query)."""
        ...

    def blobs_named(self, names: list[str], *, directory: str | None) -> set[str]:
        """The blobs among ``names`` that its rows name. ``directory`` is the listing they came from, when
        all of them do (a hint to narrow the lookup); None asks without the hint."""
        ...

    def directory_in_use(self, directory: str) -> bool:
        """Whether an empty directory under one of ``blob_prefixes`` may still be written into."""
        ...


_users: list[FileUser] = []


def file_user_register(user: FileUser) -> None:
    if all(type(known) is not type(user) for known in _users):
        _users.append(user)


def file_users() -> tuple[FileUser, ...]:
    return tuple(_users)


def file_in_use(*, file_id: str, tenant_id: int) -> str | None:
    for user in _users:
        reason = user.file_in_use(file_id=file_id, tenant_id=tenant_id)
        if reason is not None:
            return reason
    return None

"""Who still needs a file. Files sit below the batch pipeline (the import-linter contract): a batch reading
its input must keep that file from being deleted, but files cannot import batches. So the layers above
register a check here at start-up (batches/apps.py); ``file_delete`` asks every registered check."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.files.models import File

# A check answers why the file is in use (a sentence for the tenant), or None when it is free.
InUseCheck = Callable[[File], str | None]

_checks: list[InUseCheck] = []


def file_in_use_register(check: InUseCheck) -> None:
    if check not in _checks:
        _checks.append(check)


def file_in_use(file: File) -> str | None:
    for check in _checks:
        reason = check(file)
        if reason is not None:
            return reason
    return None

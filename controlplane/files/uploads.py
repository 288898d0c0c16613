"""Upload handlers: a size guard that stops reading at the limit, and a content hash taken while streaming."""

from __future__ import annotations

import hashlib
from typing import Any

from django.core.files.uploadhandler import FileUploadHandler, StopUpload


class SizeLimitUploadHandler(FileUploadHandler):
    """Placed first in the chain so an oversized upload is rejected without being stored in full."""

    def __init__(self, request: Any, *, max_bytes: int):
        super().__init__(request)
        self.max_bytes = max_bytes
        self.received = 0
        self.exceeded = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.max_bytes:
            self.exceeded = True
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


class ContentHashUploadHandler(FileUploadHandler):
    """Hashes each uploaded file's bytes as they stream past (the Idempotency-Key fingerprint of an
    upload), so the upload is never read a second time. Placed after the size guard."""

    def __init__(self, request: Any):
        super().__init__(request)
        self._digests: dict[str, hashlib._Hash] = {}
        self._current: hashlib._Hash | None = None

    def new_file(self, field_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, *args, **kwargs)
        self._current = hashlib.sha256()
        self._digests[field_name] = self._current

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        if self._current is not None:
            self._current.update(raw_data)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        self._current = None
        return None

    def hexdigest(self, field_name: str) -> str:
        """sha256 of the field's content ("" when the request had no such file)."""
        digest = self._digests.get(field_name)
        return digest.hexdigest() if digest is not None else ""

"""Upload handler that stops reading an upload the moment it passes the size limit."""

from __future__ import annotations

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

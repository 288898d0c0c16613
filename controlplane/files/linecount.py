"""Counting an upload's non-blank lines while storage reads it, so the file is read only once."""

from __future__ import annotations

import os
from typing import IO


class NonBlankLineCounter:
    """Counts lines holding something other than whitespace (``bytes.strip`` whitespace, as validation
    treats blank lines), fed in chunks that may split a line anywhere; a last line without a newline counts."""

    def __init__(self) -> None:
        self._complete = 0
        self._open_line_has_content = False  # the line the last chunk ended inside of

    def feed(self, data: bytes) -> None:
        *finished, tail = data.split(b"\n")
        if finished:
            head, *rest = finished
            # The first piece ends the line the previous chunk left open.
            self._complete += int(self._open_line_has_content or bool(head.strip()))
            self._complete += sum(map(bool, map(bytes.strip, rest)))
            self._open_line_has_content = bool(tail.strip())
        elif tail.strip():
            self._open_line_has_content = True

    @property
    def count(self) -> int:
        return self._complete + int(self._open_line_has_content)


class LineCountingReader:
    """Read-through wrapper handing storage the upload's bytes while counting its lines.

    Each byte is counted once even if the storage seeks back and reads again (Django's ``chunks()``
    seeks to 0 first; an S3 upload may re-read a part on retry). ``line_count`` is None unless every byte
    of the file was read in order, so a reader that skipped ahead never records a wrong count. Only
    reading methods are exposed: a ``temporary_file_path`` would let FileSystemStorage move the file
    without reading it.
    """

    def __init__(self, raw: IO[bytes], *, size: int):
        self._raw = raw
        self._counter = NonBlankLineCounter()
        self._position = raw.tell() if raw.seekable() else 0
        self._counted_to = 0
        self._skipped = False
        self.name = getattr(raw, "name", None)
        self.size = size

    def read(self, size: int | None = -1) -> bytes:
        data = self._raw.read(-1 if size is None else size)
        start, self._position = self._position, self._position + len(data)
        if self._position > self._counted_to:
            if start > self._counted_to:
                self._skipped = True
            self._counter.feed(data[max(0, self._counted_to - start) :])
            self._counted_to = self._position
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._raw.seek(offset, whence)
        self._position = self._raw.tell()
        return self._position

    def tell(self) -> int:
        return self._position

    def seekable(self) -> bool:
        return self._raw.seekable()

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def close(self) -> None:
        self._raw.close()

    @property
    def line_count(self) -> int | None:
        if self._skipped or self._counted_to != self.size:
            return None
        return self._counter.count

"""Streaming over JSONL with byte offsets, so shards can later seek straight to their range."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

_SKIP_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class RawLine:
    number: int  # 1-based physical line number, as an editor shows it
    start: int  # byte offset of the line's first byte
    end: int  # byte offset just past its newline
    data: bytes | None  # None when the line exceeded the length limit (its bytes were skipped)

    @property
    def is_blank(self) -> bool:
        return self.data is not None and not self.data.strip()


def iter_lines(
    stream: IO[bytes],
    *,
    max_line_bytes: int,
    start_byte: int = 0,
    end_byte: int | None = None,
    first_line_number: int = 1,
) -> Iterator[RawLine]:
    """Yield lines without ever holding more than ``max_line_bytes`` of one line in memory."""
    if start_byte:
        stream.seek(start_byte)
    offset = start_byte
    number = first_line_number
    while end_byte is None or offset < end_byte:
        data = stream.readline(max_line_bytes + 1)
        if not data:
            return
        length = len(data)
        if length > max_line_bytes and not data.endswith(b"\n"):
            # Too long: consume the rest of the line in bounded chunks and report it without content.
            while True:
                chunk = stream.readline(_SKIP_CHUNK)
                length += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield RawLine(number, offset, offset + length, None)
        else:
            yield RawLine(number, offset, offset + length, data)
        offset += length
        number += 1

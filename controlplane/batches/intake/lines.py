"""Streaming over JSONL with byte offsets, so shards can later read just their byte range, and
decoding one line's JSON so that no input can crash the reader."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

from controlplane.core.jsontext import MAX_JSON_DEPTH, bad_text, json_error_text, reject_constant, too_deep
from controlplane.kinds.base import LineIssue

_SKIP_CHUNK = 1024 * 1024
# An escaped UTF-16 surrogate (\ud800-\udfff): only then can a decoded string hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def load_json_line(raw: bytes) -> Any:
    """``json.loads`` that turns every way a line can be hostile into a LineIssue: invalid UTF-8 or JSON,
    NaN/Infinity, integers past Python's digit limit, nesting past MAX_JSON_DEPTH, lone surrogates
    (they cannot be encoded again, so they would fail the line later, in the worker). A UTF-8 BOM is
    accepted on any line, so is a CRLF line end."""
    if too_deep(raw):
        raise LineIssue("invalid_json", f"Line is nested more than {MAX_JSON_DEPTH} levels deep.")
    try:
        # Strict UTF-8 (json.loads would let encoded surrogates through); a leading BOM is dropped.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LineIssue("invalid_json", f"Line is not valid UTF-8: {exc.reason} at byte {exc.start}.") from exc
    try:
        obj = json.loads(text, parse_constant=reject_constant)
    except RecursionError as exc:  # unreachable under the depth check; kept so no input can crash the caller
        raise LineIssue("invalid_json", "Line is nested too deeply.") from exc
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer with too many digits
        raise LineIssue("invalid_json", f"Line is not valid JSON: {json_error_text(exc)}.") from exc
    # NUL is allowed in a line's text (only a model name could not be looked up, see ModelResolver).
    found = bad_text(obj, reject_nul=False) if _SURROGATE_ESCAPE.search(raw) else None
    if found is not None:
        where = found[0]
        raise LineIssue(
            "invalid_unicode",
            f"{where or 'The line'} holds a lone UTF-16 surrogate (\\ud800-\\udfff); text must be valid Unicode.",
            where[:200] or None,
        )
    return obj


class RawLine(NamedTuple):  # a tuple: built for every line of every file, half the cost of a frozen dataclass
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
    """Yield lines without ever holding more than ``max_line_bytes`` of one line in memory. ``stream``
    starts at ``start_byte`` (files.storage.blob_read_range opens it there, fetching only the range);
    the offsets only number the lines."""
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

"""`batchctl follow`: a batch's output and error lines written to files while it runs, from this service's
``GET /v1/batches/{id}/output|errors?after=<cursor>`` (an extension), with a progress display.

Each file keeps its cursor beside it (``<file>.cursor``: the batch, the lines and the bytes written), saved
after the lines it counts are flushed to disk. A dropped connection costs nothing (the next poll asks for the
lines after those kept), and a follow killed at any moment resumes from the saved cursor: the file is cut back
to the bytes the cursor counts, so a line written after the last save is fetched again, never twice.

It speaks plain HTTP (httpx2) rather than through the openai SDK, whose import alone costs a follower ~0.5–0.7 s
of CPU: a follow usually runs beside the batch it follows (docs/performance.md, "Following a batch")."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx2
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from batchctl.config import REQUEST_TIMEOUT_SECONDS, Settings
from batchctl.errors import APIRefused, error_text
from batchctl.render import TERMINAL_STATUSES
from batchctl.waiting import RateMeter, eta_text, rate_text

STREAMS = ("output", "errors")
# The Batch object feeds only the display (total, tokens/s, status), so it is read every few seconds, not every
# poll: it is the dearest of the three reads for the API (its queue position ranks the model's runnable shards),
# and the streams themselves say when they are complete.
BATCH_READ_SECONDS = 5.0


class CursorMismatch(Exception):
    """The file's saved cursor belongs to another batch or stream, or the file has no cursor."""


class ServerUnavailable(Exception):
    """The API answered 5xx: it is restarting or overloaded, and the follow rides it out."""


@dataclass(frozen=True)
class BatchState:
    """What a follow reads of the Batch object (OpenAI's fields; usage is this service's for generation)."""

    id: str
    status: str
    completed: int = 0
    failed: int = 0
    total: int = 0
    total_tokens: int = 0

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BatchState:
        counts = body.get("request_counts") or {}
        usage = body.get("usage") or {}
        return cls(
            id=str(body["id"]),
            status=str(body["status"]),
            completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0),
            total=int(counts.get("total") or 0),
            total_tokens=int(usage.get("total_tokens") or 0),
        )


def _check(response: httpx2.Response) -> None:
    if response.status_code < 400:
        return
    response.read()
    if response.status_code >= 500:
        raise ServerUnavailable(f"HTTP {response.status_code} from {response.request.url}")
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error", body) if isinstance(body, dict) else None
    raise APIRefused(error_text(response.status_code, error if isinstance(error, dict) else {}, response.text))


class FollowAPI:
    """The two reads a follow makes: the Batch object and a stream's lines after a cursor."""

    def __init__(self, settings: Settings) -> None:
        self._http = httpx2.Client(
            base_url=settings.base_url,
            headers={"Authorization": f"Bearer {settings.api_key}", "User-Agent": "batchctl-follow"},
            timeout=REQUEST_TIMEOUT_SECONDS,
        )

    def batch(self, batch_id: str) -> BatchState:
        response = self._http.get(f"/batches/{quote(batch_id, safe='')}")
        _check(response)
        return BatchState.from_json(response.json())

    @contextlib.contextmanager
    def lines(self, batch_id: str, stream: str, after: int) -> Iterator[httpx2.Response]:
        """The stream's response; an ended batch's whole file may come from S3, through a redirect to a presigned
        URL. httpx2 drops the Authorization header when a redirect leaves the API's origin (only a plain
        http → https upgrade of the same host keeps it), so the API key never reaches the bucket."""
        url = f"/batches/{quote(batch_id, safe='')}/{stream}"
        with self._http.stream("GET", url, params={"after": str(after)}, follow_redirects=True) as response:
            _check(response)
            yield response

    def close(self) -> None:
        self._http.close()


@dataclass
class Sink:
    """One stream's file: lines are appended whole, and the cursor is saved once they are on disk."""

    stream: str
    path: Path
    batch_id: str
    handle: IO[bytes]
    cursor: int = 0
    written: int = 0  # bytes, the file's length at the cursor
    complete: bool = False
    saved: tuple[int, int] = (-1, -1)  # (cursor, written) in the cursor file: a poll that brought nothing skips it

    @property
    def cursor_path(self) -> Path:
        return self.path.with_name(self.path.name + ".cursor")

    def append(self, data: bytes) -> None:
        """Whole lines only: ``data`` ends with a newline."""
        self.handle.write(data)
        self.cursor += data.count(b"\n")
        self.written += len(data)

    def save(self) -> None:
        if self.saved == (self.cursor, self.written):
            return
        self.handle.flush()
        os.fsync(self.handle.fileno())
        state = {"batch_id": self.batch_id, "stream": self.stream, "cursor": self.cursor, "bytes": self.written}
        partial = self.cursor_path.with_name(self.cursor_path.name + ".partial")
        partial.write_text(json.dumps(state))
        os.replace(partial, self.cursor_path)
        self.saved = (self.cursor, self.written)

    def close(self) -> None:
        self.handle.close()


def sink_open(path: Path, *, batch_id: str, stream: str) -> Sink:
    """The file at ``path``, resumed from its saved cursor, or a new one."""
    cursor_path = path.with_name(path.name + ".cursor")
    if cursor_path.exists():
        state = json.loads(cursor_path.read_text())
        if (state.get("batch_id"), state.get("stream")) != (batch_id, stream):
            raise CursorMismatch(
                f"{path} holds the {state.get('stream')} lines of {state.get('batch_id')}, not the {stream} lines "
                f"of {batch_id}; pass another file."
            )
        handle = path.open("r+b" if path.exists() else "w+b")
        handle.truncate(state["bytes"])  # a line written after the last save comes again
        handle.seek(state["bytes"])
        sink = Sink(stream, path, batch_id, handle, cursor=state["cursor"], written=state["bytes"])
    elif path.exists() and path.stat().st_size:
        raise CursorMismatch(f"{path} exists and was not written by `batchctl follow` (no {cursor_path.name}).")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        sink = Sink(stream, path, batch_id, path.open("wb"))
    sink.save()
    return sink


def stream_fetch(api: FollowAPI, sink: Sink) -> str:
    """Append the lines after the sink's cursor that the batch has now; returns the batch status the server
    reported. A connection dropped mid-body keeps the whole lines that arrived (httpx2 errors propagate)."""
    pending = b""
    try:
        with api.lines(sink.batch_id, sink.stream, sink.cursor) as response:
            for chunk in response.iter_bytes():
                data = pending + chunk if pending else chunk
                cut = data.rfind(b"\n") + 1
                if cut:
                    sink.append(data[:cut])
                pending = data[cut:]
    finally:
        sink.save()
    headers = _cursor_headers(response)
    expected = int(headers["X-Next-Cursor"])
    if pending or sink.cursor != expected:
        # The body ended early without a transport error (a proxy cut it): ask again from what arrived.
        raise httpx2.RemoteProtocolError(f"response ended at line {sink.cursor}, expected {expected}")
    sink.complete = headers.get("X-Results-Complete") == "true"
    return headers.get("X-Batch-Status", "")


def _cursor_headers(response: httpx2.Response) -> httpx2.Headers:
    """The API's cursor headers: on the response, or on the redirect that led to it (S3 sends only the bytes)."""
    for answer in (response, *reversed(response.history)):
        if "X-Next-Cursor" in answer.headers:
            return answer.headers
    return response.headers


def may_have_lines(batch: BatchState | None, sink: Sink) -> bool:
    """Whether the stream may hold lines after the sink's cursor. An in-progress batch's error lines are its
    committed failures (``request_counts.failed``, counted at each shard's commit), so while the batch last read
    shows no more than the file holds, asking costs the API a request for nothing. A stopped batch's error
    stream also holds the lines it never ran: from the next status on (cancelling, finalizing, an end), and at
    the end (the streams must say they are complete), it is asked every poll."""
    if sink.stream != "errors" or batch is None or batch.status != "in_progress":
        return True
    return batch.failed > sink.cursor


class FollowDisplay:
    """Lines saved of the total, tokens/s when the batch reports tokens, lines/s and an ETA: a rich bar on an
    interactive terminal, else one line per change."""

    def __init__(self, console: Console, batch_id: str) -> None:
        self.console = console
        self.lines = RateMeter()
        self.tokens = RateMeter()
        self.last: tuple[Any, ...] | None = None
        self.progress: Progress | None = None
        if console.is_interactive:
            self.progress = Progress(
                TextColumn("[bold]{task.description:<11}"),
                BarColumn(),
                TextColumn("{task.completed:.0f}/{task.fields[total_lines]} lines saved"),
                TextColumn("{task.fields[rate]}"),
                TextColumn("{task.fields[tokens]}"),
                TextColumn("{task.fields[eta]}"),
                TimeElapsedColumn(),
                console=console,
            )
            self.task = self.progress.add_task("following", total=None, total_lines="?", rate="", tokens="", eta="")
            self.progress.start()
        console.print(f"following {batch_id}")

    def update(self, batch: BatchState | None, sinks: list[Sink], note: str = "") -> None:
        now = time.monotonic()
        saved = sum(sink.cursor for sink in sinks)
        self.lines.add(now, saved)
        total = batch.total if batch is not None else 0
        tokens = batch.total_tokens if batch is not None else 0
        if tokens:
            self.tokens.add(now, tokens)
        token_rate = self.tokens.rate()
        tokens_text = f"{token_rate:.0f} tokens/s" if tokens and token_rate is not None else ""
        eta = eta_text(self.lines.eta_seconds(total - saved) if total else None)
        status = batch.status if batch is not None else "?"
        if self.progress is not None:
            self.progress.update(
                self.task,
                description=status,
                completed=saved,
                total=total or None,
                total_lines=total or "?",
                rate=rate_text(self.lines.rate()),
                tokens=tokens_text,
                eta=eta,
            )
            if note:
                self.progress.console.print(note)
            return
        state = (status, saved, total, note)
        if state != self.last:
            self.last = state
            parts = ", ".join(f"{sink.cursor} {sink.stream}" for sink in sinks)
            extra = f", {tokens_text}" if tokens_text else ""
            self.console.print(
                f"{status}: {saved}/{total or '?'} lines saved ({parts}), {rate_text(self.lines.rate())}{extra}, {eta}"
                + (f"; {note}" if note else "")
            )

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


# Transport failures a follow rides out: the server restarting, a dropped connection, a cut body.
RECOVERABLE = (ServerUnavailable, httpx2.TransportError)


def follow(
    api: FollowAPI,
    batch_id: str,
    sinks: list[Sink],
    *,
    console: Console,
    poll_seconds: float,
    give_up_after: float,
    sleep: Callable[[float], None] = time.sleep,
) -> BatchState | None:
    """Poll the batch and its streams until every stream is complete; returns the batch's last state. Gives up
    (returns None) after ``give_up_after`` seconds without one successful poll."""
    display = FollowDisplay(console, batch_id)
    last_ok = time.monotonic()
    batch: BatchState | None = None
    batch_read_at = 0.0
    try:
        while True:
            note = ""
            before = [sink.cursor for sink in sinks]
            try:
                if batch is None or time.monotonic() - batch_read_at >= BATCH_READ_SECONDS:
                    batch, batch_read_at = api.batch(batch_id), time.monotonic()
                for sink in sinks:  # output first: its status is news for the error stream's test
                    if sink.complete or not may_have_lines(batch, sink):
                        continue
                    status = stream_fetch(api, sink)
                    if batch is not None and status and status != batch.status:
                        batch, batch_read_at = api.batch(batch_id), time.monotonic()
                last_ok = time.monotonic()
            except RECOVERABLE as exc:
                if [sink.cursor for sink in sinks] != before:
                    last_ok = time.monotonic()  # cut, but lines came: the API is there
                note = f"connection lost ({type(exc).__name__}); resuming after line " + ", ".join(
                    f"{sink.cursor} of {sink.stream}" for sink in sinks
                )
                if time.monotonic() - last_ok > give_up_after:
                    display.update(batch, sinks, note)
                    return None
            display.update(batch, sinks, note)
            if all(sink.complete for sink in sinks):
                if batch is None or batch.status not in TERMINAL_STATUSES:
                    # The streams completed after the retrieve above (the batch ended in between): its state then
                    # is stale, and the exit code must say how it really ended.
                    with contextlib.suppress(*RECOVERABLE):
                        batch = api.batch(batch_id)
                display.update(batch, sinks, note)
                return batch
            if batch is not None and batch.status in TERMINAL_STATUSES and not note:
                continue  # the files exist now: read the rest at once
            sleep(poll_seconds)
    finally:
        display.close()

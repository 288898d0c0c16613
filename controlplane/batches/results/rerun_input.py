"""The input of a re-run batch (batches/results/rerun.py), built by its validation task before it validates.

The source's error file is read once into a set of custom_ids kept on local disk (an SQLite file in a
temporary directory: a million failed ids cost a few MB of page cache, not ~100 MB of Python strings), then
the source's input is read once and each line whose id is in the set is copied, byte for byte and in input
order, into the new input file, stored under the id the request reserved. Both reads go through the
validation attempt's deadline, so a slow build stops before the rescuer starts another attempt; an attempt
that finds the file already stored goes straight to validation."""

from __future__ import annotations

import json
import logging
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import InterfaceError, OperationalError

from controlplane.batches.intake.lines import iter_lines, load_json_line
from controlplane.batches.intake.validation_deadline import DeadlineStream, ValidationDeadlinePassed, attempt_stop_at
from controlplane.batches.intake.verdict import batch_validation_fail, validation_error_entry
from controlplane.batches.models import Batch, BatchStatus
from controlplane.batches.selectors import batch_input_name
from controlplane.batches.transitions import event_record
from controlplane.core.http.errors import DomainError
from controlplane.files.selectors import file_storage_name
from controlplane.files.services import file_create
from controlplane.files.storage import blob_open
from controlplane.kinds.base import LineIssue

logger = logging.getLogger(__name__)

# The new input is assembled on local disk past this size, so a million failed lines need no RAM.
_SPOOL_BYTES = 8 * 1024 * 1024
# Ids inserted per statement while the error file is read.
_INSERT_CHUNK = 5000


class _NothingToRerun(DomainError):
    code = "no_failed_lines"


def error_code_of(record: Any) -> str | None:
    """The code of one error-file line: ``error.code`` when the request never ran, else the code of the
    error body the model answered with."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("error"), dict):
        return record["error"].get("code")
    response = record.get("response")
    if isinstance(response, dict) and isinstance(response.get("body"), dict):
        error = response["body"].get("error")
        return error.get("code") if isinstance(error, dict) else None
    return None


class DiskIdSet:
    """A set of strings in an SQLite file: memory stays flat whatever the count."""

    def __init__(self, path: Path):
        self._db = sqlite3.connect(path)
        # A scratch file: nothing to recover after a crash, so no journal and no fsync.
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY) WITHOUT ROWID")

    def add_all(self, ids: list[str]) -> None:
        self._db.executemany("INSERT OR IGNORE INTO ids VALUES (?)", ((i,) for i in ids))

    def __contains__(self, item: str) -> bool:
        return self._db.execute("SELECT 1 FROM ids WHERE id = ?", (item,)).fetchone() is not None

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM ids").fetchone()[0])

    def close(self) -> None:
        self._db.close()


@contextmanager
def failed_ids_on_disk(error_stream: IO[bytes], *, codes: list[str] | None) -> Iterator[DiskIdSet]:
    """The custom_ids of an error file's lines (only those with one of ``codes``, when given)."""
    wanted = set(codes) if codes else None
    with tempfile.TemporaryDirectory(prefix="rerun-") as scratch:
        ids = DiskIdSet(Path(scratch) / "ids.sqlite3")
        try:
            chunk: list[str] = []
            for raw in iter_lines(error_stream, max_line_bytes=settings.BATCH_MAX_LINE_BYTES):
                if raw.data is None or raw.is_blank:
                    continue
                record = json.loads(raw.data)
                if wanted is None or error_code_of(record) in wanted:
                    chunk.append(record["custom_id"])
                if len(chunk) >= _INSERT_CHUNK:
                    ids.add_all(chunk)
                    chunk = []
            ids.add_all(chunk)
            yield ids
        finally:
            ids.close()


def copy_lines(source: IO[bytes], custom_ids: DiskIdSet, sink: IO[bytes]) -> int:
    copied = 0
    for raw in iter_lines(source, max_line_bytes=settings.BATCH_MAX_LINE_BYTES):
        if raw.data is None or raw.is_blank:
            continue
        try:
            line = load_json_line(raw.data)
        except LineIssue:
            continue  # cannot be: the batch ran, so validation accepted every line
        if isinstance(line, dict) and isinstance(line.get("custom_id"), str) and line["custom_id"] in custom_ids:
            sink.write(raw.data if raw.data.endswith(b"\n") else raw.data + b"\n")
            copied += 1
    return copied


def _input_build(batch: Batch) -> int:
    source = Batch.objects.get(id=batch.rerun_of)
    error_name = file_storage_name(tenant_id=source.tenant_id, file_id=source.error_file_id or "")
    # The source's input is read by the name the source kept, but only while its file is there: a tenant that
    # deleted it asked for its lines to be gone.
    input_kept = file_storage_name(tenant_id=source.tenant_id, file_id=source.input_file_id) is not None
    if error_name is None or not input_kept:
        gone = "error" if error_name is None else "input"
        raise _NothingToRerun(f"The {gone} file of batch {source.id} was deleted before its failed lines were read.")
    stop_at = attempt_stop_at(batch_id=batch.id, created_at=batch.created_at)
    codes = batch.rerun_error_codes
    with (
        blob_open(error_name) as errors,
        failed_ids_on_disk(DeadlineStream(errors, stop_at=stop_at), codes=codes) as ids,  # type: ignore[arg-type]
        tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool,
    ):
        with blob_open(batch_input_name(source)) as stream:
            copied = copy_lines(DeadlineStream(stream, stop_at=stop_at), ids, spool)  # type: ignore[arg-type]
        if not copied:
            which = f" with codes {codes}" if codes else ""
            raise _NothingToRerun(f"Batch {source.id} has no failed lines{which} to re-run.")
        size = spool.tell()
        spool.seek(0)
        file_create(
            tenant=batch.tenant,
            content=spool,
            filename=f"{source.id}_rerun.jsonl",
            purpose="batch",
            size=size,
            file_id=batch.input_file_id,
        )
    return copied


def _input_stored(batch: Batch) -> bool:
    return file_storage_name(tenant_id=batch.tenant_id, file_id=batch.input_file_id) is not None


def rerun_input_ready(*, batch_id: str) -> bool:
    """True when the batch's input can be validated: it is no re-run, or its input is stored (now or by an
    earlier attempt). False when this attempt stops: at its deadline (left ``validating`` for the rescuer),
    or having failed the batch (a file deleted meanwhile, no line with the codes asked for, the storage quota)."""
    batch = Batch.objects.select_related("tenant").filter(id=batch_id).first()
    if batch is None or not batch.rerun_of or batch.status != BatchStatus.VALIDATING:
        return True  # validation decides (and returns at once for a batch that moved on)
    if _input_stored(batch):
        return True
    try:
        copied = _input_build(batch)
    except ValidationDeadlinePassed:
        logger.warning("batch=%s re-run input not built by the attempt's deadline", batch.id)
        return False
    except (OperationalError, InterfaceError):
        raise  # nothing can be written; the rescuer's deadline on validating takes it from here
    except DomainError as exc:
        entry = {"code": exc.code, "param": None, "line": None, "message": exc.message}
        batch_validation_fail(batch, [entry])
        return False
    except Exception as exc:
        if _input_stored(batch):
            return True  # another attempt stored it first (ours clashed with its blob or row)
        logger.exception("batch=%s re-run input build failed unexpectedly", batch.id)
        what = f"Building the input from the failed lines of {batch.rerun_of} stopped ({type(exc).__name__})"
        batch_validation_fail(batch, [validation_error_entry(batch.id, what)])
        return False
    event_record(batch_id=batch.id, kind="rerun_input", message=f"{copied} failed lines of {batch.rerun_of}")
    return True

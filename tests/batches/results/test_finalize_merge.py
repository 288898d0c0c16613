"""Finalization's merge (batches/results/finalize.py) of a shard's part with the lines the part lacks, on parts
the test writes itself, as a worker would: a shard stopped midway holds results for some lines anywhere in its
range, a succeeded one for all of them, and finalization relies on a part being in line order."""

from __future__ import annotations

import io

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.batches.run.parts import encode_entry
from controlplane.batches.run.records import failed_response_record, output_record
from controlplane.batches.shards import PartSummary, shard_commit
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_delete, blob_save
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from tests.support.batches import embedding_line, file_records, jsonl, upload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def one_shard(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 1000
    settings.SCHEDULER_SHARD_SECONDS = 3600.0  # shards are cut by model time first: one shard for the whole file


def _claimed(tenant, lines: list) -> Shard:
    """A validated one-shard batch of ``lines`` (``b""`` is a blank line), its shard claimed by a worker."""
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    assert Shard.objects.filter(batch_id=batch.id).count() == 1
    shard = shard_claim_next(model=CatalogueModel.objects.get(name="all-MiniLM-L6-v2"), owner="w")
    assert shard is not None and shard.batch_id == batch.id
    return shard


def _commit(shard: Shard, results: list[tuple[int, str]], *, stopped: bool) -> None:
    """The worker commits a part holding ``results`` ((line, "out" | "err"), in the order given) for lines
    whose custom_id is ``r<line>``: an output, or a 400 response as for a request the model rejected."""
    entries = []
    for line, kind in results:
        custom_id = f"r{line}"
        record = (
            output_record(shard.batch_id, line, custom_id, {"object": "list", "data": []})
            if kind == "out"
            else failed_response_record(
                shard.batch_id, line, custom_id, status_code=400, message="rejected", code="invalid_input"
            )
        )
        entries.append(encode_entry(line, kind, record))
    name = f"parts/{shard.batch_id}/{shard.index:06d}.attempt{shard.attempt}.jsonl"
    blob_save(name, io.BytesIO(b"".join(entries)))
    completed = sum(kind == "out" for _, kind in results)
    summary = PartSummary(
        part_name=name, completed=completed, failed=len(results) - completed, tokens=TokenCounts(), stopped=stopped
    )
    assert shard_commit(shard_id=shard.id, attempt=shard.attempt, summary=summary)


def test_a_stopped_shard_keeps_its_results_and_reports_each_other_line_once_in_input_order(tenant, one_shard):
    # 300 lines, the 100th blank. The part's results are spread over the range and go past line 256: the merge
    # matches line numbers by value (CPython shares the int objects of small numbers only).
    lines = [b"" if n == 100 else embedding_line(f"r{n}", f"text {n}") for n in range(1, 301)]
    shard = _claimed(tenant, lines)
    services.batch_cancel(batch=Batch.objects.get(id=shard.batch_id))  # the worker stops after a few lines
    _commit(shard, [(2, "out"), (257, "err"), (258, "out"), (300, "out")], stopped=True)
    assert batch_try_finalize(batch_id=shard.batch_id) is True
    batch = Batch.objects.get(id=shard.batch_id)
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.CANCELLED, 3, 296)
    assert [r["custom_id"] for r in file_records(batch.output_file_id)] == ["r2", "r258", "r300"]
    errors = [
        (e["custom_id"], (e["error"] or {}).get("code") or e["response"]["status_code"])
        for e in file_records(batch.error_file_id)
    ]
    expected = [(f"r{n}", 400 if n == 257 else "batch_cancelled") for n in range(1, 301) if n not in (2, 100, 258, 300)]
    assert errors == expected


def test_a_succeeded_shard_is_copied_from_its_part_without_reading_the_input_again(tenant, one_shard):
    """Its part holds every line, so the input (which may be gigabytes) is read again only for shards whose part
    lacks lines. Deleting it before finalization shows whether it is read."""
    shard = _claimed(tenant, [embedding_line(f"r{n}", "text") for n in (1, 2, 3)])
    _commit(shard, [(1, "out"), (2, "err"), (3, "out")], stopped=False)
    batch = Batch.objects.get(id=shard.batch_id)
    blob_delete(File.objects.get(id=batch.input_file_id).storage_name)
    assert batch_try_finalize(batch_id=batch.id) is True
    batch = Batch.objects.get(id=batch.id)
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.COMPLETED, 2, 1)
    assert [r["custom_id"] for r in file_records(batch.output_file_id)] == ["r1", "r3"]
    assert [r["custom_id"] for r in file_records(batch.error_file_id)] == ["r2"]


@pytest.mark.parametrize(("order", "message"), [([1, 3, 2], "2 after 3"), ([1, 2, 2, 3], "2 after 2")])
def test_a_part_out_of_line_order_stops_finalization(tenant, one_shard, order, message):
    """The merge of a part with its missing lines holds one line of each: entries out of order or repeated would
    put lines out of input order or twice into the result files. Finalization refuses the part instead: it
    publishes nothing and the batch stays finalizing."""
    shard = _claimed(tenant, [embedding_line(f"r{n}", "text") for n in (1, 2, 3)])
    _commit(shard, [(n, "out") for n in order], stopped=False)
    with pytest.raises(RuntimeError, match=f"part entries out of line order: {message}$"):
        batch_try_finalize(batch_id=shard.batch_id)
    batch = Batch.objects.get(id=shard.batch_id)
    assert (batch.status, batch.output_file_id, batch.error_file_id) == (BatchStatus.FINALIZING, None, None)

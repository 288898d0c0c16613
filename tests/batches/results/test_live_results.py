"""Results while a batch runs: ``GET /v1/batches/{id}/output|errors?after=`` (controlplane/batches/results/live.py),
through the API, with shards run the way slots run them (the fake backend of the unit tests)."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results import live
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.batches.run.parts import encode_entry
from controlplane.batches.run.records import output_record
from controlplane.batches.shards import shard_claim_selected, shard_release
from controlplane.files.models import File
from controlplane.files.storage import blob_open, blob_save
from tests.batches.test_dead_letters import sent
from tests.batches.test_lifecycle import _create
from tests.support.batches import embedding_line
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch, run_next

pytestmark = pytest.mark.django_db(transaction=True)

# 10 lines in 5 shards of 2; lines 3 and 8 are refused by the model (error lines), the rest succeed.
LINES = [embedding_line(f"r{i}", f"text {i}" + (" REJECT" if i in (3, 8) else "")) for i in range(10)]


@pytest.fixture
def batch(tenant, sent, settings) -> Batch:
    settings.SHARD_MAX_LINES = 2
    batch = _create(tenant, LINES)
    services.batch_validate(batch_id=batch.id)
    assert Shard.objects.filter(batch=batch).count() == 5
    return Batch.objects.get(id=batch.id)


def _get(api: APIClient, batch_id: str, stream: str, after: object = None):
    query = {} if after is None else {"after": after}
    return api.get(f"/v1/batches/{batch_id}/{stream}", query)


def _page(api: APIClient, batch_id: str, stream: str, after: int = 0) -> tuple[bytes, int, bool]:
    response = _get(api, batch_id, stream, after)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/jsonl"
    body = b"".join(response.streaming_content)
    cursor = int(response["X-Next-Cursor"])
    assert cursor == after + body.count(b"\n"), "the cursor counts the lines the response holds"
    return body, cursor, response["X-Results-Complete"] == "true"


def _file_bytes(file_id: str | None) -> bytes:
    if file_id is None:
        return b""
    with blob_open(File.objects.get(id=file_id).storage_name) as fh:
        return fh.read()


def _ids(body: bytes) -> list[str]:
    return [json.loads(line)["custom_id"] for line in body.splitlines()]


def _hold(shard: Shard) -> int:
    """Claim ``shard`` as a worker that is still running it; returns that attempt."""
    claimed = shard_claim_selected(shard_id=shard.id, owner="slow worker", now=timezone.now())
    assert claimed is not None
    return claimed.attempt


def _give_back_now(shard: Shard, attempt: int) -> None:
    assert shard_release(shard_id=shard.id, attempt=attempt, error="test", content_failure=False) == "pending"
    Shard.objects.filter(id=shard.id).update(not_before=timezone.now() - timedelta(seconds=1))


def test_streams_the_committed_prefix_in_file_order_and_pages_to_the_final_files(api, batch):
    # Nothing has run: no lines yet, and the batch has not ended.
    assert _page(api, batch.id, "output") == (b"", 0, False)

    shards = list(Shard.objects.filter(batch=batch).order_by("index"))
    # Shard 0 is held by a worker still running it, whose (uncommitted) part is already in storage: shard 1
    # commits, but the stream stops at the open shard 0 and never reads the running attempt's part.
    attempt = _hold(shards[0])
    record = output_record(batch.id, 1, "r0", {"object": "list", "data": "uncommitted"})
    blob_save(f"parts/{batch.id}/000000.attempt{attempt}.jsonl", io.BytesIO(encode_entry(1, "out", record)))
    backend = FakeBackend()
    assert run_next(batch.model, backend).outcome == "succeeded"  # shard 1
    assert Shard.objects.get(id=shards[1].id).status == ShardStatus.SUCCEEDED
    assert _page(api, batch.id, "output") == (b"", 0, False)
    assert _page(api, batch.id, "errors") == (b"", 0, False)

    # The worker gives shard 0 back; its next run commits: shards 0 and 1 are the stream now (r3 failed).
    _give_back_now(shards[0], attempt)
    assert run_next(batch.model, backend).outcome == "succeeded"
    out_1, cursor_out, done = _page(api, batch.id, "output")
    assert (_ids(out_1), cursor_out, done) == (["r0", "r1", "r2"], 3, False)
    assert b"uncommitted" not in out_1
    err_1, cursor_err, _ = _page(api, batch.id, "errors")
    assert (_ids(err_1), cursor_err) == (["r3"], 1)
    # Asked again with its cursor: nothing new, nothing repeated.
    assert _page(api, batch.id, "output", cursor_out) == (b"", 3, False)
    # Resuming mid-way (a client that kept 2 of the 3 lines) gives exactly the rest, the same bytes.
    assert _page(api, batch.id, "output", 2)[0] == out_1.splitlines(keepends=True)[2]

    run_batch(batch, backend)  # the rest; the slot that closes the last shard finalizes
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    out_2, end_out, done = _page(api, batch.id, "output", cursor_out)
    err_2, end_err, _ = _page(api, batch.id, "errors", cursor_err)
    assert done and (end_out, end_err) == (8, 2)
    # The pages, joined, are the output and error files byte for byte; so is the stream from the start.
    assert out_1 + out_2 == _file_bytes(batch.output_file_id)
    assert err_1 + err_2 == _file_bytes(batch.error_file_id)
    assert _page(api, batch.id, "output")[0] == _file_bytes(batch.output_file_id)
    assert _page(api, batch.id, "output", 5)[0] == b"".join(_file_bytes(batch.output_file_id).splitlines(True)[5:])
    assert _page(api, batch.id, "output", 8) == (b"", 8, True)


def test_a_cancelled_batch_streams_its_unrun_lines_as_errors_before_its_files_exist(api, batch, sent):
    backend = FakeBackend()
    assert run_next(batch.model, backend).outcome == "succeeded"  # shard 0
    services.batch_cancel(batch=batch)  # shards 1-4 were pending: skipped
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLING
    errors, cursor, done = _page(api, batch.id, "errors")
    assert not done and cursor == 8
    assert [json.loads(line)["error"]["code"] for line in errors.splitlines()] == ["batch_cancelled"] * 8
    assert batch_try_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED
    assert errors == _file_bytes(batch.error_file_id)
    assert _page(api, batch.id, "errors", cursor) == (b"", 8, True)
    assert _page(api, batch.id, "output")[0] == _file_bytes(batch.output_file_id)


def test_a_validating_batch_streams_nothing(api, tenant, sent):
    batch = _create(tenant, LINES)
    assert batch.status == BatchStatus.VALIDATING
    response = _get(api, batch.id, "output")
    assert response.status_code == 200
    assert (b"".join(response.streaming_content), response["X-Next-Cursor"]) == (b"", "0")
    assert (response["X-Results-Complete"], response["X-Batch-Status"]) == ("false", "validating")


def test_another_tenants_batch_is_a_404(batch, other_tenant):
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {other_tenant.raw_key}")
    for stream in ("output", "errors"):
        response = _get(stranger, batch.id, stream)
        assert response.status_code == 404
        assert response.json()["error"]["param"] == "batch_id"
    assert _get(APIClient(), batch.id, "output").status_code == 401


@pytest.mark.parametrize("after", ["abc", "-1", "1.5", "1e3", "9" * 30, "11"])
def test_a_bad_cursor_is_a_400_that_says_what_a_cursor_is(api, batch, after):
    response = _get(api, batch.id, "output", after)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == "after"
    assert "X-Next-Cursor" in error["message"]


def test_a_deleted_output_file_is_a_409_once_the_batch_ended(api, batch):
    run_batch(batch, FakeBackend())
    batch.refresh_from_db()
    api.delete(f"/v1/files/{batch.output_file_id}")
    response = _get(api, batch.id, "output")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "results_file_deleted"


@pytest.mark.parametrize("cache_bytes", [0, 64 * 1024 * 1024], ids=["read", "kept"])
def test_a_cursor_into_a_closed_shard_whose_part_is_read_in_pieces(
    api, tenant, sent, settings, monkeypatch, cache_bytes
):
    # Two shards of 12 lines, every fifth line refused. Storage reads of 100 bytes cut the part's lines (~300
    # bytes each) mid-way, so the bulk reader of a succeeded shard's part must carry each cut line over. Every
    # cursor is answered from storage, and from the shard's lines kept after the first poll (part_cache.py).
    settings.RESULTS_PART_CACHE_BYTES = cache_bytes
    monkeypatch.setattr(live, "READ_CHUNK_BYTES", 100)
    settings.SHARD_MAX_LINES = 12
    lines = [embedding_line(f"c{i:02d}", f"text {i}" + (" REJECT" if i % 5 == 2 else "")) for i in range(24)]
    batch = _create(tenant, lines)
    services.batch_validate(batch_id=batch.id)
    batch = Batch.objects.get(id=batch.id)
    backend = FakeBackend()
    assert run_next(batch.model, backend).outcome == "succeeded"  # shard 0: 10 output lines, 2 errors
    whole, cursor, _ = _page(api, batch.id, "output")
    assert (len(whole.splitlines()), cursor) == (10, 10)
    # From every cursor inside the shard: exactly the lines after it, the same bytes.
    for after in range(11):
        assert _page(api, batch.id, "output", after) == (b"".join(whole.splitlines(True)[after:]), 10, False)
    assert _ids(_page(api, batch.id, "errors", 1)[0]) == ["c07"]

    run_batch(batch, backend)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    assert _file_bytes(batch.output_file_id).startswith(whole)
    assert _page(api, batch.id, "output")[0] == _file_bytes(batch.output_file_id)


def test_an_ended_batchs_cursor_seeks_to_the_files_nearest_point(api, batch, monkeypatch):
    # Seek points every ~200 bytes (a few lines apart): every cursor gives exactly the file's lines after it, read
    # from the last point at or before it, never again from the file's first byte.
    monkeypatch.setattr("controlplane.batches.results.finalize.LINE_INDEX_STEP_BYTES", 200)
    assert run_batch(batch, FakeBackend()) == ["succeeded"] * 5
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    output = File.objects.get(id=batch.output_file_id)
    content = _file_bytes(output.id)
    starts = [0, *[i + 1 for i, byte in enumerate(content) if byte == ord("\n")][:-1]]  # each line's first byte
    assert output.line_offsets and all(starts[line] == offset for line, offset in output.line_offsets)
    assert [line for line, _ in output.line_offsets] == sorted({line for line, _ in output.line_offsets})
    reads = []
    real_range = live.blob_read_range
    monkeypatch.setattr(live, "blob_read_range", lambda name, start=0: reads.append(start) or real_range(name, start))
    lines = content.splitlines(keepends=True)
    for after in range(len(lines) + 1):
        body, cursor, complete = _page(api, batch.id, "output", after)
        assert (body, cursor, complete) == (b"".join(lines[after:]), len(lines), True)
    # The last cursor with lines to read starts at the last seek point, not at byte 0.
    assert reads[-1] == output.line_offsets[-1][1] > 0


def test_an_ended_batchs_whole_file_is_handed_to_the_proxy_with_its_cursor(api, batch, settings):
    # As a file download: nginx sends it (deploy/k8s/base/nginx.conf sets the cursor's headers again from these);
    # a cursor into the file is still sent from here, from its seek point.
    settings.FILE_DOWNLOAD_ACCEL_PREFIX = "/_protected_blobs/"
    assert run_batch(batch, FakeBackend()) == ["succeeded"] * 5
    batch.refresh_from_db()
    response = _get(api, batch.id, "output")
    assert response.status_code == 200 and not response.streaming and response.content == b""
    output = File.objects.get(id=batch.output_file_id)
    assert response["X-Accel-Redirect"] == "/_protected_blobs/" + output.storage_name
    assert (response["X-Next-Cursor"], response["X-Results-Complete"], response["X-Batch-Status"]) == (
        "8",
        "true",
        "completed",
    )
    body, cursor, complete = _page(api, batch.id, "output", 3)
    assert (cursor, complete) == (8, True) and body == b"".join(_file_bytes(output.id).splitlines(True)[3:])
    settings.FILE_DOWNLOAD_ACCEL_PREFIX = ""
    assert _page(api, batch.id, "output")[0] == _file_bytes(output.id)  # without the setting: streamed here

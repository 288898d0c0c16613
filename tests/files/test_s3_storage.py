"""Storage on a real S3-compatible server (moto's, in its own process; tests/files/conftest.py) and on local
files: ranged reads fetch only their range, uploads through the API land in the bucket, a batch runs end to
end with its output in S3, a lost part is reported rather than retried forever, and downloads stream."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.batches.run import execution
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_read_range, blob_save
from tests.support.batches import embedding_line, jsonl, tensor_line, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

pytestmark = pytest.mark.django_db(transaction=True)

# What one GET costs beyond its body: status line and headers (moto sends ~400 bytes), with room to spare.
_RESPONSE_OVERHEAD_BYTES = 4 * 1024


@pytest.fixture
def eager(settings, monkeypatch):
    # Tasks enqueued on commit would run in-process; these tests drive the services themselves.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


def _save(name: str, content: bytes) -> None:
    import io

    blob_save(name, io.BytesIO(content))


def test_ranged_reads_return_exactly_the_range(any_storage):
    content = bytes(range(256)) * 40
    _save("blobs/range", content)
    for start, end in [(0, None), (0, 10), (300, 2000), (5000, None), (10_000, 20_000), (7, 7), (20_000, None)]:
        with blob_read_range("blobs/range", start, end) as reader:
            expected = content[start:end]
            assert reader.length == len(expected), (start, end)
            assert reader.read() == expected, (start, end)


def test_a_missing_blob_is_file_not_found(any_storage):
    with pytest.raises(FileNotFoundError):
        blob_read_range("blobs/never-written", 0, 10)


def test_ranged_read_downloads_only_its_range(s3_bucket):
    content = b"".join(b"%06d " % i + b"x" * 1000 + b"\n" for i in range(2000))  # ~2 MB
    _save("blobs/big", content)
    proxy = s3_bucket.server.proxy
    before = proxy.received
    with blob_read_range("blobs/big", 100_000, 110_000) as reader:
        assert reader.read() == content[100_000:110_000]
    transferred = proxy.received - before
    assert 10_000 <= transferred < 10_000 + _RESPONSE_OVERHEAD_BYTES


def test_upload_through_the_api_lands_in_the_bucket(s3_bucket, api, storage_dir):
    content = jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(50)])
    response = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"}, format="multipart"
    )
    assert response.status_code == 200, response.content
    file = File.objects.get(id=response.json()["id"])
    assert s3_bucket.keys() == [file.storage_name]
    assert s3_bucket.read(file.storage_name) == content
    assert file.line_count == 50 and file.bytes == len(content)
    assert not storage_dir.exists() or not any(storage_dir.rglob("*"))  # nothing went to local disk


def test_a_shard_fetches_only_its_byte_range(s3_bucket, tenant, eager, settings):
    settings.SHARD_MAX_LINES = 16
    lines = [embedding_line(f"r{i}", f"sentence {i} " + "word " * 200) for i in range(400)]
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    shards = list(Shard.objects.filter(batch=batch).order_by("index"))
    shard = shards[len(shards) // 2]
    shard_bytes = shard.end_byte - shard.start_byte
    assert file.bytes > 10 * shard_bytes  # reading the whole input would show

    # The shards before it wait out a backoff (as after a transient failure), so the slot serves the middle one.
    Shard.objects.filter(batch=batch, index__lt=shard.index).update(not_before=timezone.now() + timedelta(hours=1))
    proxy = s3_bucket.server.proxy
    before = proxy.received
    assert run_shard(shard, FakeBackend(), owner="t") == "succeeded"
    transferred = proxy.received - before

    # One ranged GET of the input; the part's upload (a HEAD for a name clash, a PUT) brings back headers only.
    assert shard_bytes <= transferred < shard_bytes + 3 * _RESPONSE_OVERHEAD_BYTES
    shard.refresh_from_db()
    part = s3_bucket.read(shard.part_name).splitlines()
    assert [int(entry.split(b" ", 1)[0]) for entry in part] == list(range(shard.start_line, shard.end_line + 1))


def _lines_of(bucket, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in bucket.read(File.objects.get(id=file_id).storage_name).splitlines()]


def test_a_batch_runs_end_to_end_with_its_files_in_s3(s3_bucket, tenant, eager, settings, monkeypatch):
    """Shard 0 runs fully, shard 1 is stopped by a cancel after two of its four calls (its part is merged
    with the input's lines it lacks), shard 2 never runs: every custom_id lands in exactly one file."""
    settings.SHARD_MAX_LINES = 4
    settings.DISPATCH_INFLIGHT_CALLS = 1  # one call at a time, so the cancel lands between two calls
    monkeypatch.setattr(execution, "CHECK_INTERVAL_SECONDS", 0.0)
    # Tensor lines of different widths cannot be stacked: one Triton call per line.
    lines = [tensor_line(f"t{i}", [[float(i)] * (1 + i % 4)]) for i in range(12)]
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    shards = list(Shard.objects.filter(batch=batch).order_by("index"))
    assert [s.request_count for s in shards] == [4, 4, 4]

    assert run_shard(shards[0], FakeBackend(), owner="t") == "succeeded"

    def cancel_after_second_call(calls: int) -> None:
        if calls == 2:
            services.batch_cancel(batch=Batch.objects.get(id=batch.id))

    backend = FakeBackend(on_call=cancel_after_second_call)
    assert run_shard(shards[1], backend, owner="t") == "stopped"
    # The slot that stopped the last open shard finalized the batch (scheduling/runner.py): nothing is left to do.
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLED
    assert not batch_try_finalize(batch_id=batch.id)

    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED
    assert Shard.objects.get(id=shards[2].id).status == ShardStatus.SKIPPED
    output, errors = _lines_of(s3_bucket, batch.output_file_id), _lines_of(s3_bucket, batch.error_file_id)
    assert (batch.completed_lines, batch.failed_lines) == (len(output), len(errors)) == (6, 6)
    ids = [r["custom_id"] for r in output] + [r["custom_id"] for r in errors]
    assert sorted(ids) == sorted(f"t{i}" for i in range(12))
    # Each file in input order; the cancelled lines are reported as such.
    assert [r["custom_id"] for r in output] == sorted((r["custom_id"] for r in output), key=lambda c: int(c[1:]))
    assert [r["custom_id"] for r in errors] == sorted((r["custom_id"] for r in errors), key=lambda c: int(c[1:]))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert {r["custom_id"] for r in output} >= {"t0", "t1", "t2", "t3"}
    assert output[0]["response"]["body"]["outputs"][0]["data"] == [0.0]


def test_a_part_lost_from_the_bucket_becomes_part_lost_lines(s3_bucket, tenant, eager, settings):
    settings.SHARD_MAX_LINES = 4
    file = upload(tenant, jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(8)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    first, second = Shard.objects.filter(batch=batch).order_by("index")
    assert run_shard(first, FakeBackend(), owner="t") == "succeeded"
    first.refresh_from_db()
    s3_bucket.client.delete_object(Bucket=s3_bucket.name, Key=first.part_name)
    assert run_shard(second, FakeBackend(), owner="t") == "succeeded"

    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert [r["custom_id"] for r in _lines_of(s3_bucket, batch.output_file_id)] == [f"r{i}" for i in range(4, 8)]
    errors = _lines_of(s3_bucket, batch.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(f"r{i}", "part_lost") for i in range(4)]


def test_content_download_streams_with_a_content_length(any_storage, api, tenant):
    content = jsonl([embedding_line(f"r{i}", "word " * (i % 50)) for i in range(3000)])  # several chunks
    file = upload(tenant, content)
    response = api.get(f"/v1/files/{file.id}/content")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Length"] == str(len(content))
    assert response["Content-Type"] == "application/jsonl"
    chunks = list(response.streaming_content)
    response.close()
    assert len(chunks) > 1 and b"".join(chunks) == content


def test_openai_sdk_round_trip_over_http_with_s3(s3_bucket, live_server, tenant):
    """The tenant's SDK against a real HTTP server: upload into the bucket, download the streamed bytes."""
    from openai import OpenAI

    content = jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(200)])
    # Closed at the end: a kept-alive connection would hold the live server's request thread (and its
    # database session) open past the test.
    with OpenAI(base_url=f"{live_server.url}/v1", api_key=tenant.raw_key, max_retries=0) as client:
        created = client.files.create(file=("in.jsonl", content), purpose="batch")
        assert s3_bucket.read(File.objects.get(id=created.id).storage_name) == content
        assert client.files.content(created.id).content == content

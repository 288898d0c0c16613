"""An ended batch's whole result file on S3 with FILE_DOWNLOAD_PRESIGNED_SECONDS set (batches/views.py): a 302 to a
presigned URL that carries the cursor's headers itself, as a file download redirects (files/views.py); a cursor into
the file is still streamed from its seek point. On the moto S3 server of the storage tests (tests/files/conftest.py),
fetching the URL as a client does."""

from __future__ import annotations

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus
from controlplane.files.models import File
from tests.batches.results.test_live_results import LINES, _get, _page
from tests.batches.test_dead_letters import sent
from tests.batches.test_lifecycle import _create
from tests.files.conftest import s3_bucket, s3_server
from tests.files.test_download_presigned import _fetch
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ended(s3_bucket, tenant, sent, settings) -> Batch:
    """A completed batch of 10 lines (8 output, 2 error) whose files are in the S3 bucket."""
    settings.SHARD_MAX_LINES = 2
    batch = _create(tenant, LINES)
    services.batch_validate(batch_id=batch.id)
    assert run_batch(batch, FakeBackend()) == ["succeeded"] * 5
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    return batch


@pytest.mark.parametrize(("stream", "lines"), [("output", 8), ("errors", 2)])
def test_an_ended_batch_from_the_start_redirects_to_its_file_with_the_cursor(
    s3_bucket, api, ended, settings, stream, lines
):
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 60
    file = File.objects.get(id=ended.output_file_id if stream == "output" else ended.error_file_id)
    received = s3_bucket.server.proxy.received
    response = _get(api, ended.id, stream, 0)
    assert response.status_code == 302
    assert not response.streaming and response.content == b""
    assert s3_bucket.server.proxy.received == received  # signing fetched nothing from S3
    assert (response["X-Next-Cursor"], response["X-Results-Complete"], response["X-Batch-Status"]) == (
        str(lines),
        "true",
        "completed",
    )
    assert response["Cache-Control"] == "no-store"
    url = response["Location"]
    assert url.startswith(s3_bucket.server.endpoint_url) and "X-Amz-Expires=60" in url
    assert f"/{s3_bucket.name}/{file.storage_name}?" in url
    status, body, headers = _fetch(url)
    assert status == 200 and body == s3_bucket.read(file.storage_name)
    assert body.count(b"\n") == lines and headers["Content-Type"] == "application/jsonl"


def test_a_cursor_into_the_file_is_still_streamed(s3_bucket, api, ended, settings):
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 60
    content = s3_bucket.read(File.objects.get(id=ended.output_file_id).storage_name)
    body, cursor, complete = _page(api, ended.id, "output", 3)
    assert (body, cursor, complete) == (b"".join(content.splitlines(True)[3:]), 8, True)
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 0  # off: the whole file is streamed through the web process
    assert _page(api, ended.id, "output")[0] == content

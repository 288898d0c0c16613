"""Presigned S3 downloads (FILE_DOWNLOAD_PRESIGNED_SECONDS, files/views.py): on S3 storage the content view checks
the tenant, then redirects to a short-lived presigned URL, so S3 sends the bytes rather than a web thread. Tested on
the moto S3 server the other storage tests use (tests/files/conftest.py), fetching the URL as a client would; moto
does not verify signatures, so expiry and key binding are checked in the URL's signed terms."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime
from email.message import Message
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support.batches import embedding_line, jsonl, upload

pytestmark = pytest.mark.django_db(transaction=True)
CONTENT = jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(50)])


def _fetch(url: str) -> tuple[int, bytes, Message]:
    """GET a URL without credentials, as the SDK does after a cross-origin redirect."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_the_download_redirects_to_a_presigned_url_that_serves_the_file(s3_bucket, api, tenant, settings):
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 60
    file = upload(tenant, CONTENT)
    received = s3_bucket.server.proxy.received
    response = api.get(f"/v1/files/{file.id}/content")
    assert response.status_code == 302
    assert response["Cache-Control"] == "no-store"
    assert not response.streaming and response.content == b""
    assert s3_bucket.server.proxy.received == received  # signing fetched nothing from S3
    url = response["Location"]
    assert url.startswith(s3_bucket.server.endpoint_url) and "X-Amz-Expires=60" in url and "X-Amz-Signature=" in url
    status, body, headers = _fetch(url)
    assert status == 200 and body == CONTENT
    assert headers["Content-Type"] == "application/jsonl"
    assert headers["Content-Disposition"] == f'inline; filename="{file.filename}"'


def test_the_url_is_signed_for_this_key_only_and_for_the_configured_time(s3_bucket, api, tenant, settings):
    """What S3 enforces (expiry, the signature over the key): moto's server does not check signatures, so the
    terms are read from the URL itself, as S3 reads them."""
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 90
    file = upload(tenant, CONTENT)
    url = urlsplit(api.get(f"/v1/files/{file.id}/content")["Location"])
    query = parse_qs(url.query)
    assert url.path == f"/{s3_bucket.name}/{file.storage_name}"
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["90"]
    assert query["X-Amz-SignedHeaders"] == ["host"] and len(query["X-Amz-Signature"][0]) == 64
    # Issued now: valid from this moment for 90 s, not longer.
    issued = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - issued).total_seconds()) < 30
    assert "testing/" in query["X-Amz-Credential"][0]  # the storage's own credentials, not a tenant's


def test_off_or_on_local_storage_the_view_streams(s3_bucket, api, tenant, settings, storage_dir):
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 0
    file = upload(tenant, CONTENT)
    response = api.get(f"/v1/files/{file.id}/content")
    assert response.status_code == 200 and b"".join(response.streaming_content) == CONTENT
    response.close()


def test_on_local_storage_the_setting_changes_nothing(api, tenant, settings):
    settings.FILE_DOWNLOAD_PRESIGNED_SECONDS = 60
    file = upload(tenant, CONTENT)
    response = api.get(f"/v1/files/{file.id}/content")
    assert response.status_code == 200 and b"".join(response.streaming_content) == CONTENT
    response.close()

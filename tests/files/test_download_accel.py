"""File downloads handed to the reverse proxy (FILE_DOWNLOAD_ACCEL_PREFIX, files/views.py): on local storage the
view answers with an ``X-Accel-Redirect`` to nginx's internal location (deploy/nginx/nginx.conf) instead of
streaming the blob from a gunicorn thread; the tenant check stays the view's."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from tests.deploy.test_nginx import internal_blob_location
from tests.support.batches import embedding_line, jsonl, upload

pytestmark = pytest.mark.django_db
CONTENT = jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(50)])


def test_a_download_is_handed_to_nginx_when_configured(api, tenant, settings, storage_dir):
    prefix, alias = internal_blob_location()  # the shipped nginx config's internal location
    settings.FILE_DOWNLOAD_ACCEL_PREFIX = prefix
    file = upload(tenant, CONTENT)
    response = api.get(f"/v1/files/{file.id}/content")
    assert response.status_code == 200
    assert not response.streaming and response.content == b""  # no byte of the blob went through this thread
    assert response["Content-Type"] == "application/jsonl"
    assert response["Content-Disposition"] == f'inline; filename="{file.filename}"'
    target = response["X-Accel-Redirect"]
    assert target.startswith(prefix)
    # What nginx will send: its alias is the storage root (STORAGE_ROOT), here the test's storage directory.
    relative = unquote(target.removeprefix(prefix))
    assert alias.rstrip("/") == "/var/lib/controlplane/storage"
    assert (storage_dir / relative).read_bytes() == CONTENT


def test_another_tenants_file_is_not_handed_over(api, other_tenant, settings):
    settings.FILE_DOWNLOAD_ACCEL_PREFIX = "/_blobs/"
    theirs = upload(other_tenant, CONTENT)
    response = api.get(f"/v1/files/{theirs.id}/content")
    assert response.status_code == 404 and not response.has_header("X-Accel-Redirect")


def test_without_the_setting_the_view_streams_itself(api, tenant, settings):
    settings.FILE_DOWNLOAD_ACCEL_PREFIX = ""
    file = upload(tenant, CONTENT)
    response = api.get(f"/v1/files/{file.id}/content")
    assert response.streaming and not response.has_header("X-Accel-Redirect")
    assert b"".join(response.streaming_content) == CONTENT
    response.close()


@pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection a test transaction lives on
def test_the_openai_sdk_gets_the_bytes_through_a_handing_proxy(tenant, settings, storage_dir):
    """What nginx does with the header, done by a WSGI wrapper: the SDK's files.content still gets the file."""
    import httpx2
    import openai
    from django.core.wsgi import get_wsgi_application

    settings.FILE_DOWNLOAD_ACCEL_PREFIX = "/_blobs/"
    django_app = get_wsgi_application()

    def proxy(environ, start_response):
        captured = {}

        def capture(status, headers, exc_info=None):
            captured.update(status=status, headers=headers)

        body = b"".join(django_app(environ, capture))
        headers = dict(captured["headers"])
        target = headers.pop("X-Accel-Redirect", None)
        if target is not None:
            body = (storage_dir / unquote(target.removeprefix("/_blobs/"))).read_bytes()
            headers["Content-Length"] = str(len(body))
        start_response(captured["status"], list(headers.items()))
        return [body]

    file = upload(tenant, CONTENT)
    client = openai.OpenAI(
        api_key=tenant.raw_key,
        base_url="http://testserver/v1",
        http_client=httpx2.Client(transport=httpx2.WSGITransport(app=proxy)),
    )
    assert client.files.content(file.id).content == CONTENT

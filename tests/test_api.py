"""REST API behaviour the SDK tests do not reach: auth, scoping, bodies of 4xx responses, admin pages."""

from __future__ import annotations

import io

import pytest

# Admin URLs escape "_" in primary keys (batch_…, wh_…): the raw id can decode to another one.
from django.contrib.admin.utils import quote as admin_quote
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from tests.support.batches import embedding_line, jsonl

pytestmark = pytest.mark.django_db


def _upload(api, content: bytes = b'{"a": 1}\n', purpose: str = "batch"):
    return api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": purpose}, format="multipart"
    )


def test_requests_without_a_valid_key_are_401():
    response = APIClient().get("/v1/batches")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer sk-cp-wrong")
    assert client.get("/v1/files").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Basic abc")
    assert "Bearer" in client.get("/v1/files").json()["error"]["message"]


def test_api_key_is_stored_hashed_only(tenant):
    from controlplane.tenants.models import ApiKey

    key = ApiKey.objects.get(tenant=tenant)
    assert tenant.raw_key not in (key.key_hash, key.prefix) and len(key.key_hash) == 64
    assert tenant.raw_key.startswith(key.prefix)


def test_tenant_create_command_prints_key_last(db, catalogue):
    from django.core.management import call_command

    out = io.StringIO()
    call_command("tenant_create", "cmd-tenant", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/v1/batches").status_code == 200


def test_upload_checks_purpose_and_size(api, settings):
    assert _upload(api, purpose="fine-tune").json()["error"]["param"] == "purpose"
    settings.FILE_MAX_BYTES = 100
    response = _upload(api, content=b"x" * 5000)
    assert response.status_code == 413
    assert "100 byte limit" in response.json()["error"]["message"]
    from controlplane.files.models import File

    assert not File.objects.exists()  # nothing half-stored


def test_other_tenants_objects_are_404(api, other_tenant):
    file_id = _upload(api).json()["id"]
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {other_tenant.raw_key}")
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        assert stranger.get(path).status_code == 404
    assert stranger.delete(f"/v1/files/{file_id}").status_code == 404
    response = stranger.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
        format="json",
    )
    assert response.status_code == 404
    assert stranger.get("/v1/files", {"after": file_id}).status_code == 400  # not a cursor it can use


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"endpoint": "/v1/embeddings", "completion_window": "24h"}, "input_file_id"),
        ({"input_file_id": "FILE", "endpoint": "/v1/chat", "completion_window": "24h"}, "endpoint"),
        ({"input_file_id": "FILE", "endpoint": "/v1/embeddings", "completion_window": "1h"}, "completion_window"),
        (
            {"input_file_id": "FILE", "endpoint": "/v1/embeddings", "completion_window": "24h", "metadata": {"k": 1}},
            "metadata",
        ),
        ({"input_file_id": "file-nope", "endpoint": "/v1/embeddings", "completion_window": "24h"}, "file_id"),
    ],
)
def test_batch_create_errors_name_the_parameter(api, payload, param):
    file_id = _upload(api, jsonl([embedding_line("a", "x")])).json()["id"]
    payload = {k: (file_id if v == "FILE" else v) for k, v in payload.items()}
    response = api.post("/v1/batches", payload, format="json")
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["param"] == param


def test_a_batch_never_exists_without_its_origin(api, tenant, monkeypatch, django_capture_on_commit_callbacks):
    """The origin (the API key that created the batch: the ledger's group_by=api_key_id) is written in the
    create transaction, so a failed origin write leaves no batch behind, and a created batch has its origin."""
    from django.db import DatabaseError

    from controlplane.batches.models import Batch
    from controlplane.tenants.models import ApiKey
    from controlplane.usage.models import BatchOrigin

    file_id = _upload(api, jsonl([embedding_line("a", "x")])).json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}

    def refuse(**kwargs: object) -> None:
        raise DatabaseError("the origin write failed")

    with monkeypatch.context() as patch, django_capture_on_commit_callbacks(execute=False):
        patch.setattr(BatchOrigin.objects, "get_or_create", refuse)
        assert api.post("/v1/batches", body, format="json").status_code == 500
    assert not Batch.objects.exists()

    with django_capture_on_commit_callbacks(execute=False):
        created = api.post("/v1/batches", body, format="json").json()
    assert BatchOrigin.objects.get(batch_id=created["id"]).api_key_id == ApiKey.objects.get(tenant=tenant).id


def test_concurrent_batch_quota_is_429(api, tenant, django_capture_on_commit_callbacks):
    tenant.max_concurrent_batches = 1
    tenant.save()
    file_id = _upload(api, jsonl([embedding_line("a", "x")])).json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    with django_capture_on_commit_callbacks(execute=False):
        assert api.post("/v1/batches", body, format="json").status_code == 200
        response = api.post("/v1/batches", body, format="json")
    assert response.status_code == 429
    assert "limit is 1" in response.json()["error"]["message"]


def test_deleting_an_input_file_in_use_is_409(api, django_capture_on_commit_callbacks):
    file_id = _upload(api, jsonl([embedding_line("a", "x")])).json()["id"]
    with django_capture_on_commit_callbacks(execute=False):
        api.post(
            "/v1/batches",
            {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
            format="json",
        )
    response = api.delete(f"/v1/files/{file_id}")
    assert response.status_code == 409 and "cancel the batch" in response.json()["error"]["message"]


def test_pagination_limit_is_validated(api):
    assert api.get("/v1/batches", {"limit": 0}).status_code == 400
    assert api.get("/v1/batches", {"limit": "x"}).json()["error"]["param"] == "limit"


def test_admin_pages_render(admin_client, api, tenant, django_capture_on_commit_callbacks):
    from controlplane.batches.models import Batch

    file_id = _upload(api, jsonl([embedding_line("a", "x")])).json()["id"]
    with django_capture_on_commit_callbacks(execute=False):
        batch_id = api.post(
            "/v1/batches",
            {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
            format="json",
        ).json()["id"]
    for path in (
        "tenants/tenant",
        "tenants/apikey",
        "files/file",
        "batches/batch",
        "batches/shard",
        "batches/batchevent",
        "fleet/cataloguemodel",
    ):
        assert admin_client.get(f"/admin/{path}/").status_code == 200, path
    page = admin_client.get(f"/admin/batches/batch/{admin_quote(batch_id)}/change/")
    assert page.status_code == 200 and tenant.raw_key.encode() not in admin_client.get("/admin/tenants/apikey/").content
    response = admin_client.post("/admin/batches/batch/", {"action": "cancel_batches", "_selected_action": [batch_id]})
    assert response.status_code == 302
    assert Batch.objects.get(id=batch_id).status == "cancelled"


def test_admin_static_files_are_served_by_the_local_stack(client):
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200

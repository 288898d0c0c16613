"""Data lifecycle through the API: expires_after, output_expires_after, the in-use 409 and the storage
quota, with the official openai SDK where it has the parameter (in process, over a WSGI transport)."""

from __future__ import annotations

from datetime import timedelta

import httpx2
import openai
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.wsgi import get_wsgi_application
from django.utils import timezone

from controlplane.batches import services as batch_services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.uploads import SizeLimitUploadHandler
from tests.support.batches import embedding_line, jsonl
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch

pytestmark = pytest.mark.django_db

CONTENT = jsonl([embedding_line("a", "x"), embedding_line("b", "y")])


@pytest.fixture
def quiet(monkeypatch):
    # Nothing reaches a broker: the on_commit sends of batch create go nowhere.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


@pytest.fixture
def keep_test_connection():
    """A WSGI request closes the database connection when it finishes; the test's transaction lives on it."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


class Sdk:
    """The official client, and the paths of the requests it sent (retries show up as repeats)."""

    def __init__(self, tenant, **options):
        self.paths: list[str] = []
        self.client = openai.OpenAI(
            api_key=tenant.raw_key,
            base_url="http://testserver/v1",
            http_client=httpx2.Client(
                transport=httpx2.WSGITransport(app=get_wsgi_application()),
                event_hooks={"request": [lambda request: self.paths.append(request.url.path)]},
            ),
            **options,
        )


@pytest.fixture
def sdk(tenant, keep_test_connection):
    return Sdk(tenant)


def _upload(api, content: bytes = CONTENT, **fields):
    return api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch", **fields}, format="multipart"
    )


def _stored_uploads(storage_dir, tenant) -> list[str]:
    directory = storage_dir / "files" / str(tenant.id)
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


class TestExpiresAfter:
    def test_the_sdk_sets_it_and_the_file_object_shows_it(self, sdk):
        created = sdk.client.files.create(
            file=("in.jsonl", CONTENT), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
        )
        assert created.expires_at == created.created_at + 3600
        assert sdk.client.files.retrieve(created.id).expires_at == created.expires_at
        [listed] = sdk.client.files.list().data
        assert listed.expires_at == created.expires_at
        stored = File.objects.get(id=created.id)
        assert stored.expires_at == stored.created_at + timedelta(seconds=3600)

    def test_without_it_a_file_does_not_expire(self, sdk):
        assert sdk.client.files.create(file=("in.jsonl", CONTENT), purpose="batch").expires_at is None

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"}, "expires_after.seconds"),
            ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"}, "expires_after.seconds"),
            ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1h"}, "expires_after.seconds"),
            ({"expires_after[anchor]": "created_at"}, "expires_after.seconds"),
            ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "expires_after.anchor"),
            ({"expires_after[seconds]": "3600"}, "expires_after.anchor"),
            (
                {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600", "expires_after[x]": "1"},
                "expires_after",
            ),
            ({"expires_after": '{"anchor": "created_at", "seconds": 3600}'}, "expires_after"),
        ],
    )
    def test_bad_values_are_400_naming_the_field(self, api, fields, param):
        response = _upload(api, **fields)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == param
        assert not File.objects.exists()

    def test_the_bounds_are_openais(self, api):
        assert (
            _upload(api, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}).status_code == 200
        )
        longest = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592000"}
        assert _upload(api, **longest).status_code == 200

    def test_the_sdk_gets_a_bad_request_error(self, sdk):
        with pytest.raises(openai.BadRequestError, match="between 3600"):
            sdk.client.files.create(
                file=("in.jsonl", CONTENT), purpose="batch", expires_after={"anchor": "created_at", "seconds": 60}
            )

    def test_an_expired_file_is_gone_for_the_tenant_before_beat_deletes_it(self, sdk, quiet):
        file_id = sdk.client.files.create(file=("in.jsonl", CONTENT), purpose="batch").id
        File.objects.filter(id=file_id).update(expires_at=timezone.now() - timedelta(seconds=1))
        with pytest.raises(openai.NotFoundError):
            sdk.client.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            sdk.client.files.content(file_id)
        assert sdk.client.files.list().data == []
        with pytest.raises(openai.NotFoundError):
            sdk.client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")

    def test_a_key_replays_only_the_same_expiry(self, api):
        expiry = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
        headers = {"Idempotency-Key": "up-1"}
        first = api.post(
            "/v1/files", {"file": SimpleUploadedFile("a", CONTENT), "purpose": "batch", **expiry}, headers=headers
        )
        again = api.post(
            "/v1/files", {"file": SimpleUploadedFile("a", CONTENT), "purpose": "batch", **expiry}, headers=headers
        )
        other = api.post("/v1/files", {"file": SimpleUploadedFile("a", CONTENT), "purpose": "batch"}, headers=headers)
        assert first.status_code == again.status_code == 200 and again.json() == first.json()
        assert other.status_code == 409


class TestOutputExpiresAfter:
    def test_the_sdk_sets_it_and_the_result_files_expire(self, sdk, quiet, settings):
        settings.SHARD_MAX_LINES = 4
        client = sdk.client
        file_id = client.files.create(file=("in.jsonl", CONTENT), purpose="batch").id
        batch = client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/embeddings",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 86400},
        )
        assert Batch.objects.get(id=batch.id).output_expires_after == 86400
        batch_services.batch_validate(batch_id=batch.id)
        run_batch(Batch.objects.get(id=batch.id), FakeBackend())
        done = client.batches.retrieve(batch.id)
        assert done.status == BatchStatus.COMPLETED and done.output_file_id
        output = client.files.retrieve(done.output_file_id)
        assert output.expires_at == output.created_at + 86400
        assert client.files.retrieve(file_id).expires_at is None

    @pytest.mark.parametrize(
        ("value", "param"),
        [
            ({"anchor": "created_at", "seconds": 10}, "output_expires_after.seconds"),
            ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds"),
            ({"anchor": "created_at", "seconds": True}, "output_expires_after.seconds"),
            ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor"),
            ({"seconds": 3600}, "output_expires_after.anchor"),
            ("3600", "output_expires_after"),
        ],
    )
    def test_bad_values_are_400_naming_the_field(self, api, quiet, value, param):
        file_id = _upload(api).json()["id"]
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
            "output_expires_after": value,
        }
        response = api.post("/v1/batches", body, format="json")
        assert response.status_code == 400 and response.json()["error"]["param"] == param
        assert not Batch.objects.exists()


def test_deleting_the_input_of_a_live_batch_is_409_naming_it(tenant, quiet, keep_test_connection):
    sdk = Sdk(tenant, max_retries=0)
    file_id = sdk.client.files.create(file=("in.jsonl", CONTENT), purpose="batch").id
    batch = sdk.client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.ConflictError, match=batch.id) as raised:
        sdk.client.files.delete(file_id)
    assert raised.value.status_code == 409 and raised.value.code == "conflict"
    assert File.objects.filter(id=file_id).exists()
    sdk.client.batches.cancel(batch.id)  # validating → cancelled at once: the file is free
    assert sdk.client.files.delete(file_id).deleted


class TestStorageQuota:
    def test_a_file_larger_than_the_whole_quota_is_413(self, tenant, sdk, storage_dir):
        tenant.storage_quota_bytes = len(CONTENT) - 1
        tenant.save()
        with pytest.raises(openai.APIStatusError) as raised:
            sdk.client.files.create(file=("in.jsonl", CONTENT), purpose="batch")
        assert raised.value.status_code == 413
        error = raised.value.body
        assert error["code"] == "storage_quota_exceeded" and error["param"] == "file"
        assert error["type"] == "invalid_request_error"
        assert f"whole storage quota of {len(CONTENT) - 1} bytes" in error["message"]
        assert sdk.paths == ["/v1/files"]  # not retried
        assert not File.objects.exists() and _stored_uploads(storage_dir, tenant) == []

    def test_a_file_that_does_not_fit_beside_the_others_is_429(self, tenant, sdk, storage_dir):
        tenant.storage_quota_bytes = len(CONTENT) * 2
        tenant.save()
        sdk.client.files.create(file=("a.jsonl", CONTENT), purpose="batch")
        sdk.client.files.create(file=("b.jsonl", CONTENT), purpose="batch")
        sdk.paths.clear()
        with pytest.raises(openai.RateLimitError) as raised:
            sdk.client.files.create(file=("c.jsonl", CONTENT), purpose="batch")
        response = raised.value.response
        assert response.headers["x-should-retry"] == "false" and response.headers["Retry-After"] == "60"
        assert response.headers["x-ratelimit-remaining-storage-quota-bytes"] == "0"
        error = raised.value.body
        assert error["code"] == "storage_quota_exceeded" and error["type"] == "rate_limit_error"
        assert error["limit"] == {
            "name": "storage_quota_bytes",
            "value": len(CONTENT) * 2,
            "current": len(CONTENT) * 2,
            "requested": len(CONTENT),
        }
        assert "delete files" in error["message"]
        assert sdk.paths == ["/v1/files"]  # x-should-retry: false, so the SDK does not retry
        assert File.objects.count() == 2 and len(_stored_uploads(storage_dir, tenant)) == 2
        # Deleting a file makes room.
        sdk.client.files.delete(File.objects.order_by("created_at").first().id)
        assert sdk.client.files.create(file=("c.jsonl", CONTENT), purpose="batch").bytes == len(CONTENT)

    def test_results_count_toward_the_quota(self, tenant, api):
        File.objects.create(
            tenant=tenant, filename="r.jsonl", purpose="batch_output", bytes=1000, storage_name="results/x"
        )
        tenant.storage_quota_bytes = 1000 + len(CONTENT) - 1
        tenant.save()
        assert _upload(api).status_code == 429

    def test_a_declared_length_over_the_quota_is_refused_unread(self, tenant, api, monkeypatch):
        received: list[int] = []
        real = SizeLimitUploadHandler.receive_data_chunk
        monkeypatch.setattr(
            SizeLimitUploadHandler,
            "receive_data_chunk",
            lambda self, data, start: received.append(len(data)) or real(self, data, start),
        )
        big = b"x" * 200_000
        tenant.storage_quota_bytes = 100_000
        tenant.save()
        assert _upload(api, big).status_code == 413 and received == []  # alone over the quota
        tenant.storage_quota_bytes = 300_000
        tenant.save()
        File.objects.create(tenant=tenant, filename="r", purpose="batch", bytes=250_000, storage_name="files/x")
        response = _upload(api, big)
        assert response.status_code == 429 and received == []  # beside the others
        assert response.json()["error"]["limit"]["requested"] > 100_000

    def test_within_the_framing_slack_the_stream_is_stopped_at_the_quota(self, tenant, api, monkeypatch):
        received: list[int] = []
        real = SizeLimitUploadHandler.receive_data_chunk
        monkeypatch.setattr(
            SizeLimitUploadHandler,
            "receive_data_chunk",
            lambda self, data, start: received.append(len(data)) or real(self, data, start),
        )
        tenant.storage_quota_bytes = 100_000
        tenant.save()
        # 40 kB over the quota: inside the 64 KiB allowed for multipart framing, so it is read, up to the quota.
        response = _upload(api, b"x" * 140_000)
        assert response.status_code == 413 and response.json()["error"]["code"] == "storage_quota_exceeded"
        assert 100_000 < sum(received) < 140_000
        assert not File.objects.exists()

    def test_concurrent_uploads_are_checked_again_under_the_lock(self, tenant, storage_dir):
        """Two uploads that each passed the early checks: the second one's row transaction finds the
        first stored, refuses it, and deletes the blob it had stored."""
        import io

        from controlplane.core.http.errors import QuotaExceeded
        from controlplane.files.services import file_create

        tenant.storage_quota_bytes = len(CONTENT) + 10
        tenant.save()
        create = {"tenant": tenant, "filename": "in.jsonl", "purpose": "batch", "size": len(CONTENT)}
        file_create(content=io.BytesIO(CONTENT), **create)
        with pytest.raises(QuotaExceeded):
            file_create(content=io.BytesIO(CONTENT), **create)
        assert File.objects.count() == 1 and len(_stored_uploads(storage_dir, tenant)) == 1

    def test_a_replayed_upload_is_not_refused_for_its_own_bytes(self, tenant, api):
        tenant.storage_quota_bytes = len(CONTENT) + 10
        tenant.save()
        headers = {"Idempotency-Key": "quota-replay"}
        first = api.post("/v1/files", {"file": SimpleUploadedFile("a", CONTENT), "purpose": "batch"}, headers=headers)
        again = api.post("/v1/files", {"file": SimpleUploadedFile("a", CONTENT), "purpose": "batch"}, headers=headers)
        assert first.status_code == again.status_code == 200 and again.json() == first.json()
        assert again["Idempotent-Replayed"] == "true"

    def test_every_tenant_has_the_service_default_unless_it_has_its_own(self, tenant, api, settings, storage_dir):
        from controlplane.tenants.services import tenant_create

        assert settings.TENANT_STORAGE_QUOTA_BYTES == 100 * 1024**3  # the shipped default is not unlimited
        fresh = tenant_create(name="no-override")[0]
        assert fresh.storage_quota_bytes is None and fresh.storage_quota == 100 * 1024**3
        # The default is read when enforced, so an operator's change reaches tenants without their own.
        settings.TENANT_STORAGE_QUOTA_BYTES = len(CONTENT) - 1
        response = _upload(api)
        assert response.status_code == 413 and response.json()["error"]["code"] == "storage_quota_exceeded"
        assert f"whole storage quota of {len(CONTENT) - 1} bytes" in response.json()["error"]["message"]
        # The tenant's own quota overrides it, up or down.
        tenant.storage_quota_bytes = len(CONTENT) * 2
        tenant.save()
        assert _upload(api).status_code == 200
        settings.TENANT_STORAGE_QUOTA_BYTES = 0  # no service default: a tenant's own still holds
        assert _upload(api).status_code == 200 and _upload(api).status_code == 429
        tenant.storage_quota_bytes = None
        tenant.save()
        assert _upload(api).status_code == 200  # neither: unlimited

    def test_the_admin_edits_it(self, admin_client, tenant):
        page = admin_client.get(f"/admin/tenants/tenant/{tenant.id}/change/")
        assert page.status_code == 200
        assert b"storage_quota_bytes" in page.content and b"Storage used" in page.content

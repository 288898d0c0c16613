"""Re-running a finished batch's failed lines as a new batch (controlplane/batches/results/rerun.py), through the
API, the service and the admin action, with the fake backend of the unit tests."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard
from controlplane.batches.results.rerun import batch_rerun_failed
from controlplane.batches.tasks import batch_validate_task
from controlplane.core.http.errors import ValidationFailed
from controlplane.core.messaging import dispatch
from controlplane.files import storage
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from controlplane.tenants.models import ApiKey
from controlplane.usage.models import BatchOrigin
from tests.batches.test_dead_letters import CrashingBackend, _run, sent
from tests.batches.test_lifecycle import _create
from tests.support.batches import embedding_line, file_records, jsonl
from tests.support.fakes import FakeBackend

pytestmark = pytest.mark.django_db(transaction=True)

LINES = [embedding_line(f"r{i}", f"text {i}") for i in range(8)]


@pytest.fixture
def half_failed(tenant, sent, settings) -> Batch:
    """8 lines in two shards of 4: the first shard dies (internal_error lines), the second succeeds."""
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = _create(tenant, LINES, metadata={"team": "search"}, priority="low")
    services.batch_validate(batch_id=batch.id)
    first, second = Shard.objects.filter(batch=batch).order_by("index")
    assert _run(first, CrashingBackend()) == "dead"
    assert _run(second, FakeBackend()) == "succeeded"
    batch = Batch.objects.get(id=batch.id)
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.COMPLETED, 4, 4)
    return batch


def _content(file_id: str) -> bytes:
    with blob_open(File.objects.get(id=file_id).storage_name) as fh:
        return fh.read()


def test_failed_lines_rerun_through_the_api_complete_the_work_exactly_once(api, sent, half_failed):
    response = api.post(f"/v1/batches/{half_failed.id}/rerun", {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "batch" and body["status"] == "validating"
    assert body["rerun_of"] == half_failed.id
    # The key that asked is the new batch's origin (the ledger groups by it), written with the batch.
    assert BatchOrigin.objects.get(batch_id=body["id"]).api_key_id == ApiKey.objects.get(tenant=half_failed.tenant).id
    assert (body["endpoint"], body["metadata"], body["priority"]) == ("/v1/embeddings", {"team": "search"}, "low")
    # The validation task (durable, through the outbox) builds the input, then validates it.
    assert (dispatch.VALIDATE, [body["id"]]) in sent
    assert not File.objects.filter(id=body["input_file_id"]).exists()
    batch_validate_task(body["id"])
    # The new input is the failed lines, byte for byte and in their original order, under the id the API gave.
    assert _content(body["input_file_id"]) == jsonl(LINES[:4])
    assert Batch.objects.get(id=body["id"]).status == BatchStatus.IN_PROGRESS
    batch_validate_task(body["id"])  # a redelivered or rescued message: the stored input is kept, not built again
    assert File.objects.filter(filename=f"{half_failed.id}_rerun.jsonl").count() == 1

    for shard in Shard.objects.filter(batch_id=body["id"]).order_by("index"):
        _run(shard, FakeBackend())
    rerun = Batch.objects.get(id=body["id"])
    assert (rerun.status, rerun.completed_lines, rerun.failed_lines) == (BatchStatus.COMPLETED, 4, 0)
    done = [r["custom_id"] for r in file_records(half_failed.output_file_id) + file_records(rerun.output_file_id)]
    assert sorted(done) == sorted(line["custom_id"] for line in LINES)
    assert BatchEvent.objects.filter(batch=half_failed, kind="rerun", message__contains=rerun.id).exists()


def test_rerun_keeps_the_priority_within_what_the_tenant_may_ask(tenant, half_failed):
    Batch.objects.filter(id=half_failed.id).update(priority="high")  # raised by an operator
    half_failed.refresh_from_db()
    assert batch_rerun_failed(batch=half_failed, actor="t").priority == tenant.max_priority == "normal"


def test_rerun_filtered_by_error_code(tenant, half_failed):
    # Which codes the lines failed with is known only once the error file is read: by the task, which fails
    # the new batch saying so.
    nothing = batch_rerun_failed(batch=half_failed, actor="t", error_codes=["batch_cancelled"])
    batch_validate_task(nothing.id)
    nothing.refresh_from_db()
    assert nothing.status == BatchStatus.FAILED
    [error] = nothing.errors["data"]
    assert error["code"] == "no_failed_lines" and "no failed lines with codes ['batch_cancelled']" in error["message"]
    files_before, batches_before = File.objects.count(), Batch.objects.count()
    with pytest.raises(ValidationFailed, match="completion_window"):
        batch_rerun_failed(batch=half_failed, actor="t", completion_window="1h")
    assert (File.objects.count(), Batch.objects.count()) == (files_before, batches_before)
    rerun = batch_rerun_failed(batch=half_failed, actor="t", error_codes=["internal_error"], completion_window="24h")
    batch_validate_task(rerun.id)
    assert _content(rerun.input_file_id) == jsonl(LINES[:4])


def test_the_api_answers_without_reading_a_file(api, sent, half_failed, monkeypatch):
    """The error file of a large batch is a gigabyte: the request must not read it (nor the input)."""

    def no_reads(*args, **kwargs):
        raise AssertionError("the rerun request read a blob")

    monkeypatch.setattr(storage, "blob_read_range", no_reads)
    response = api.post(f"/v1/batches/{half_failed.id}/rerun", {"error_codes": ["internal_error"]}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "validating"
    assert (dispatch.VALIDATE, [response.json()["id"]]) in sent


def test_a_source_file_deleted_before_the_task_fails_the_rerun_with_a_reason(tenant, sent, half_failed):
    rerun = batch_rerun_failed(batch=half_failed, actor="t")
    File.objects.filter(id=half_failed.error_file_id).delete()
    batch_validate_task(rerun.id)
    rerun.refresh_from_db()
    assert rerun.status == BatchStatus.FAILED
    assert "error file of batch" in rerun.errors["data"][0]["message"]


def test_rerun_refusals_are_4xx_with_reasons(tenant, other_tenant, api, sent, half_failed):
    open_batch = _create(tenant, LINES[:2])
    response = api.post(f"/v1/batches/{open_batch.id}/rerun", {}, format="json")
    assert response.status_code == 409 and "is validating" in response.json()["error"]["message"]
    assert response["x-should-retry"] == "false"  # the openai SDK would retry a 409 twice otherwise

    bad = api.post(f"/v1/batches/{half_failed.id}/rerun", {"error_codes": "internal_error"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "error_codes"

    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {other_tenant.raw_key}")
    assert stranger.post(f"/v1/batches/{half_failed.id}/rerun", {}, format="json").status_code == 404

    clean = _create(tenant, LINES[:2])
    services.batch_validate(batch_id=clean.id)
    for shard in Shard.objects.filter(batch=clean):
        _run(shard, FakeBackend())
    response = api.post(f"/v1/batches/{clean.id}/rerun", {}, format="json")
    assert response.status_code == 409 and "no failed lines" in response.json()["error"]["message"]

    error_file = File.objects.get(id=half_failed.error_file_id)
    File.objects.filter(id=error_file.id).delete()
    response = api.post(f"/v1/batches/{half_failed.id}/rerun", {}, format="json")
    assert response.status_code == 409 and "error file" in response.json()["error"]["message"]
    error_file.save()

    File.objects.filter(id=half_failed.input_file_id).delete()
    response = api.post(f"/v1/batches/{half_failed.id}/rerun", {}, format="json")
    assert response.status_code == 409 and "was deleted" in response.json()["error"]["message"]


def test_a_rerun_refused_by_a_quota_does_no_work_and_leaves_nothing_behind(tenant, api, half_failed, monkeypatch):
    _create(tenant, LINES[:2])  # one active batch
    tenant.max_concurrent_batches = 1
    tenant.save(update_fields=["max_concurrent_batches"])
    files_before, batches_before = File.objects.count(), Batch.objects.count()

    def no_reads(*args, **kwargs):
        raise AssertionError("a refused rerun read a blob")

    monkeypatch.setattr(storage, "blob_read_range", no_reads)
    response = api.post(f"/v1/batches/{half_failed.id}/rerun", {}, format="json")
    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "concurrent_batches_limit_exceeded"
    assert (File.objects.count(), Batch.objects.count()) == (files_before, batches_before)


def test_the_enqueued_lines_quota_counts_the_failed_lines(tenant, api, half_failed):
    tenant.max_enqueued_lines = half_failed.failed_lines - 1
    tenant.save(update_fields=["max_enqueued_lines"])
    response = api.post(f"/v1/batches/{half_failed.id}/rerun", {}, format="json")
    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "enqueued_lines_limit_exceeded"


def test_admin_action_reruns_failed_lines(half_failed, admin_client, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    response = admin_client.post(
        "/admin/batches/batch/",
        {"action": "rerun_failed_lines", "_selected_action": [half_failed.id]},
        follow=True,
    )
    rerun = Batch.objects.get(rerun_of=half_failed.id)
    assert f"Created {rerun.id}." in response.content.decode()
    assert BatchEvent.objects.filter(batch=rerun, kind="rerun_created", message__startswith="by admin").exists()

"""The storage quota's reservation of a batch's results (files/quota.py): validation estimates the
output size (kinds/base.EndpointKind.output_bytes_estimate; embeddings: lines × dimensions) and, under the tenant
row lock, refuses a batch that does not fit or passes BATCH_MAX_OUTPUT_BYTES, else reserves the bytes until the
batch ends and its result files count instead. Uploads see the reserved bytes as used."""

from __future__ import annotations

import json

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from controlplane.files.models import File, StorageReservation
from controlplane.files.quota import storage_used
from controlplane.files.storage import blob_open
from controlplane.kinds.base import OUTPUT_LINE_BYTES
from controlplane.kinds.embeddings import FLOAT_JSON_BYTES
from tests.support.batches import embedding_line, jsonl, upload, validated_batch
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch

pytestmark = pytest.mark.django_db(transaction=True)
LINES = 20
DIMENSIONS = 384  # all-MiniLM-L6-v2 (fleet/catalogue/seed.py)
EXPECTED = LINES * (OUTPUT_LINE_BYTES + DIMENSIONS * FLOAT_JSON_BYTES)
INPUT = jsonl([embedding_line(f"r{i}", f"some text number {i}") for i in range(LINES)])


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


def _validated(tenant) -> Batch:
    file = upload(tenant, INPUT)
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def test_results_are_reserved_from_validation_until_the_output_file_replaces_them(tenant):
    batch = _validated(tenant)
    assert batch.status == BatchStatus.IN_PROGRESS
    reservation = StorageReservation.objects.get(batch_id=batch.id)
    assert (reservation.tenant_id, reservation.bytes) == (tenant.id, EXPECTED)
    assert storage_used(tenant_id=tenant.id) == len(INPUT) + EXPECTED

    assert run_batch(batch, FakeBackend()) == ["succeeded"]  # the slot that closes the last shard finalizes
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    assert not StorageReservation.objects.filter(batch_id=batch.id).exists()
    output = File.objects.get(id=batch.output_file_id)
    assert storage_used(tenant_id=tenant.id) == len(INPUT) + output.bytes
    # The estimate is an estimate, but of the right size: not under the real output, nor twice it.
    assert output.bytes <= EXPECTED < 2 * output.bytes, (output.bytes, EXPECTED)
    with blob_open(output.storage_name) as stream:
        first = stream.readline()
    vector = json.loads(first)["response"]["body"]["data"][0]["embedding"]
    assert len(vector) == DIMENSIONS
    envelope = len(first) - len(orjson.dumps(vector))  # the line without its vector
    assert 0 < envelope <= OUTPUT_LINE_BYTES, envelope
    print(f"output line: {len(first)} bytes, {envelope} of them the envelope")


def test_a_batch_whose_results_do_not_fit_fails_validation(tenant):
    tenant.storage_quota_bytes = len(INPUT) + EXPECTED - 1
    tenant.save()
    batch = _validated(tenant)
    assert batch.status == BatchStatus.FAILED
    (error,) = batch.errors["data"]
    assert error["code"] == "storage_quota_exceeded"
    assert (
        f"~{EXPECTED} bytes" in error["message"] and f"storage quota of {len(INPUT) + EXPECTED - 1}" in error["message"]
    )
    assert not StorageReservation.objects.exists()
    # Exactly enough room: it runs.
    tenant.storage_quota_bytes = 2 * len(INPUT) + EXPECTED
    tenant.save()
    assert _validated(tenant).status == BatchStatus.IN_PROGRESS


def test_the_service_default_quota_applies_to_results_too(tenant, settings):
    settings.TENANT_STORAGE_QUOTA_BYTES = len(INPUT) + EXPECTED - 1
    assert tenant.storage_quota_bytes is None
    batch = _validated(tenant)
    assert batch.status == BatchStatus.FAILED and batch.errors["data"][0]["code"] == "storage_quota_exceeded"


def test_a_batch_over_the_output_cap_fails_validation(tenant, settings):
    settings.BATCH_MAX_OUTPUT_BYTES = EXPECTED - 1
    batch = _validated(tenant)
    assert batch.status == BatchStatus.FAILED
    (error,) = batch.errors["data"]
    assert error["code"] == "output_too_large" and f"limit of {EXPECTED - 1} bytes per batch" in error["message"]


def test_reserved_bytes_count_against_uploads(tenant, api):
    tenant.storage_quota_bytes = len(INPUT) + EXPECTED + 1000
    tenant.save()
    _validated(tenant)
    small = b"x" * 900  # fits beside the stored file, not beside the reservation too
    response = api.post("/v1/files", {"file": SimpleUploadedFile("a.jsonl", small), "purpose": "batch"})
    assert response.status_code == 200, response.content
    response = api.post("/v1/files", {"file": SimpleUploadedFile("b.jsonl", small), "purpose": "batch"})
    assert response.status_code == 429
    assert response.json()["error"]["limit"]["current"] == len(INPUT) + EXPECTED + 900


def test_a_cancelled_batch_gives_its_reservation_back(tenant):
    batch = _validated(tenant)
    services.batch_cancel(batch=batch)
    assert batch_try_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED
    assert not StorageReservation.objects.exists()
    # Its unrun lines are batch_cancelled lines of the error file, which counts now instead.
    errors = File.objects.get(id=batch.error_file_id)
    assert storage_used(tenant_id=tenant.id) == len(INPUT) + errors.bytes < len(INPUT) + EXPECTED


def _chat_batch(tenant, **fields) -> Batch:
    body = {"model": "tinylm", "messages": [{"role": "user", "content": "count from 1 to 9"}], "max_tokens": 64}
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {**body, **fields}}
        for i in range(LINES)
    ]
    return validated_batch(tenant, lines, endpoint="/v1/chat/completions")


def test_a_generation_reservation_counts_choices_and_logprobs(tenant):
    # The same prompts and max_tokens, so the same work units: the output differs ~200× with top_logprobs 20 and
    # the reservation must follow it, or a tenant's results outgrow its quota unchecked.
    plain = _chat_batch(tenant)
    plain_bytes = StorageReservation.objects.get(batch_id=plain.id).bytes
    logprobs = _chat_batch(tenant, logprobs=True, top_logprobs=20, n=4)
    logprobs_bytes = StorageReservation.objects.get(batch_id=logprobs.id).bytes
    assert logprobs.work_units < 5 * plain.work_units
    assert logprobs_bytes > 100 * plain_bytes, (plain_bytes, logprobs_bytes)
    # A quota the plain batch fits refuses the logprobs batch at validation, before any of it runs.
    room_for_inputs = 64 * 1024  # the next two input files, far below the logprobs batch's reservation
    tenant.storage_quota_bytes = storage_used(tenant_id=tenant.id) + plain_bytes + room_for_inputs
    tenant.save()
    assert _chat_batch(tenant).status == BatchStatus.IN_PROGRESS
    refused = _chat_batch(tenant, logprobs=True, top_logprobs=20, n=4)
    assert refused.status == BatchStatus.FAILED
    assert refused.errors["data"][0]["code"] == "storage_quota_exceeded"

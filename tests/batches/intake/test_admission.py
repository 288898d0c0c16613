"""Admission at batch create: priority classes, the concurrent-batch and enqueued-lines quotas (429)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches.intake.admission import batch_admit
from controlplane.batches.models import Batch, BatchStatus
from controlplane.core.http.errors import QuotaExceeded, ValidationFailed
from controlplane.files.models import File
from controlplane.tenants.models import Tenant
from tests.support.batches import embedding_line, jsonl, upload

pytestmark = pytest.mark.django_db


def _file(tenant, lines: int) -> File:
    return upload(tenant, jsonl([embedding_line(f"r{i}", "x") for i in range(lines)]))


def _batch(tenant, file: File, status: str = BatchStatus.VALIDATING, total_lines: int = 0) -> Batch:
    """A batch row as batch_create writes it, with what it keeps of its input."""
    return Batch.objects.create(
        tenant=tenant,
        endpoint="/v1/embeddings",
        input_file_id=file.id,
        input_storage_name=file.storage_name,
        input_line_count=file.line_count,
        completion_window="24h",
        expires_at=timezone.now() + timedelta(hours=24),
        status=status,
        total_lines=total_lines,
    )


def _limits(tenant, **values) -> Tenant:
    Tenant.objects.filter(id=tenant.id).update(**values)
    return Tenant.objects.get(id=tenant.id)


def test_no_priority_gets_the_tenants_default(tenant):
    tenant = _limits(tenant, default_priority="low")
    assert batch_admit(tenant=tenant, input_file=_file(tenant, 1), priority=None) == "low"


def test_a_default_above_the_maximum_is_lowered_to_it(tenant):
    tenant = _limits(tenant, default_priority="high", max_priority="normal")  # only possible outside the admin
    assert batch_admit(tenant=tenant, input_file=_file(tenant, 1), priority=None) == "normal"


@pytest.mark.parametrize(("max_priority", "asked"), [("high", "high"), ("normal", "normal"), ("normal", "low")])
def test_priorities_up_to_the_maximum_are_admitted(tenant, max_priority, asked):
    tenant = _limits(tenant, max_priority=max_priority)
    assert batch_admit(tenant=tenant, input_file=_file(tenant, 1), priority=asked) == asked


def test_a_priority_above_the_maximum_is_400_naming_it(tenant):
    tenant = _limits(tenant, max_priority="normal")
    with pytest.raises(ValidationFailed) as raised:
        batch_admit(tenant=tenant, input_file=_file(tenant, 1), priority="high")
    assert raised.value.status_code == 400 and raised.value.param == "priority"
    assert raised.value.message == ("priority 'high' is above the highest class allowed for this tenant, 'normal'.")


@pytest.mark.parametrize("asked", ["urgent", "HIGH", "", 1, ["high"]])
def test_an_unknown_priority_is_400(tenant, asked):
    with pytest.raises(ValidationFailed) as raised:
        batch_admit(tenant=tenant, input_file=_file(tenant, 1), priority=asked)
    assert raised.value.param == "priority"
    assert "'high', 'normal', 'low'" in raised.value.message


def test_a_bad_priority_is_400_even_over_quota(tenant):
    tenant = _limits(tenant, max_concurrent_batches=0)
    with pytest.raises(ValidationFailed):
        batch_admit(tenant=tenant, input_file=_file(tenant, 1), priority="urgent")


def test_concurrent_batches_at_the_limit_is_429(tenant, other_tenant):
    tenant = _limits(tenant, max_concurrent_batches=2)
    file = _file(tenant, 1)
    _batch(tenant, file)
    _batch(tenant, file, status=BatchStatus.IN_PROGRESS, total_lines=1)
    _batch(tenant, file, status=BatchStatus.COMPLETED, total_lines=1)  # terminal: does not count
    _batch(other_tenant, _file(other_tenant, 1))  # another tenant's: does not count
    with pytest.raises(QuotaExceeded) as raised:
        batch_admit(tenant=tenant, input_file=file, priority=None)
    exc = raised.value
    assert exc.status_code == 429 and exc.code == "concurrent_batches_limit_exceeded"
    assert "limit is 2" in exc.message
    assert exc.limit_body() == {"name": "max_concurrent_batches", "value": 2, "current": 2, "requested": 1}
    assert exc.retry_after == 60
    headers = exc.response_headers()
    assert headers["Retry-After"] == "60" and headers["x-ratelimit-remaining-concurrent-batches"] == "0"
    assert headers["x-should-retry"] == "false"


def test_enqueued_lines_count_validated_totals_and_upload_counts(tenant, other_tenant):
    """Validating batches count their file's uploaded line count; validated ones their total_lines;
    terminal batches and other tenants' batches nothing."""
    tenant = _limits(tenant, max_enqueued_lines=10)
    _batch(tenant, _file(tenant, 3))  # validating: 3 from the upload's count
    _batch(tenant, _file(tenant, 1), status=BatchStatus.IN_PROGRESS, total_lines=4)  # validated: 4
    _batch(tenant, _file(tenant, 9), status=BatchStatus.CANCELLED, total_lines=9)
    _batch(other_tenant, _file(other_tenant, 9))
    assert batch_admit(tenant=tenant, input_file=_file(tenant, 3), priority=None) == "normal"  # 7 + 3 = 10
    with pytest.raises(QuotaExceeded) as raised:
        batch_admit(tenant=tenant, input_file=_file(tenant, 4), priority=None)
    exc = raised.value
    assert exc.code == "enqueued_lines_limit_exceeded"
    assert exc.limit_body() == {"name": "max_enqueued_lines", "value": 10, "current": 7, "requested": 4}
    assert "over the limit of 10" in exc.message
    assert exc.response_headers()["x-ratelimit-remaining-enqueued-lines"] == "3"


def test_files_stored_before_line_counting_add_nothing(tenant):
    tenant = _limits(tenant, max_enqueued_lines=2)
    old = _file(tenant, 5)
    File.objects.filter(id=old.id).update(line_count=None)
    old.refresh_from_db()
    _batch(tenant, old)  # a validating batch on an uncounted file counts 0 (validation checks it later)
    assert batch_admit(tenant=tenant, input_file=old, priority=None) == "normal"


def test_over_quota_through_the_api_is_429_with_the_limit(api, tenant):
    tenant = _limits(tenant, max_enqueued_lines=2)
    file_id = _file(tenant, 3).id
    response = api.post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
        format="json",
    )
    assert response.status_code == 429
    assert response["Retry-After"] == "60" and response["x-ratelimit-limit-enqueued-lines"] == "2"
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "enqueued_lines_limit_exceeded"
    assert error["limit"] == {"name": "max_enqueued_lines", "value": 2, "current": 0, "requested": 3}
    assert not Batch.objects.exists()

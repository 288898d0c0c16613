"""The enqueued-token quota bounds what a generation batch can cost: each line counts its prompt and every token its
n choices may generate (n × max_tokens), not the scheduler's estimate of its completion."""

from __future__ import annotations

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus
from controlplane.fleet.models import CatalogueModel
from controlplane.tenants.models import Tenant
from tests.support.batches import jsonl, upload

pytestmark = pytest.mark.django_db(transaction=True)

COMPLETIONS = "/v1/completions"


def _line(custom_id: str, **body: object) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": COMPLETIONS,
        "body": {"model": "tinylm", "prompt": "count from 1 to 3", **body},
    }


def _validated(tenant: Tenant, lines: list[dict]) -> Batch:
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint=COMPLETIONS, completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def test_generation_lines_count_their_max_completion_against_the_token_quota(tenant):
    # The model's measured completions are short: the estimate (work units) is far below what the lines may generate.
    CatalogueModel.objects.filter(name="tinylm").update(expected_completion_tokens=2.0, completion_weight=1.0)
    lines = [_line(f"r{i}", max_tokens=200, n=2) for i in range(3)]
    batch = _validated(tenant, lines)
    assert batch.status == BatchStatus.IN_PROGRESS, batch.errors
    prompt = (batch.quota_tokens - 3 * 2 * 200) // 3
    assert prompt > 0 and batch.quota_tokens == 3 * (prompt + 2 * 200)
    assert batch.work_units == 3 * (prompt + 2 * 2)  # the scheduler's estimate is unchanged

    # A quota above the estimate but below the possible output refuses the same file.
    Tenant.objects.filter(id=tenant.id).update(max_enqueued_tokens=2 * batch.quota_tokens - 1)
    refused = _validated(tenant, lines)
    assert refused.status == BatchStatus.FAILED
    [error] = refused.errors["data"]
    assert error["code"] == "token_limit_exceeded"
    assert f"~{batch.quota_tokens} tokens" in error["message"] and f"~{2 * batch.quota_tokens}," in error["message"]

    # Under the quota, a line counts the same.
    Tenant.objects.filter(id=tenant.id).update(max_enqueued_tokens=10**9)
    ok = _validated(tenant, lines[:1])
    assert ok.status == BatchStatus.IN_PROGRESS and ok.quota_tokens == prompt + 400

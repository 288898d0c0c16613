"""The scheduler on the wire: priority on create and on the batch object, the queue position, and the
enqueued-token quota at validation."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.batches import services
from controlplane.batches.models import Batch
from controlplane.core.messaging import dispatch
from controlplane.scheduling import selectors
from controlplane.tenants.models import Tenant
from tests.support.batches import embedding_line, jsonl, tensor_line

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet(monkeypatch, settings):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2


def _create(api, lines: list[dict], endpoint: str, **extra) -> dict:
    upload = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", jsonl(lines)), "purpose": "batch"}, format="multipart"
    )
    response = api.post(
        "/v1/batches",
        {"input_file_id": upload.json()["id"], "endpoint": endpoint, "completion_window": "24h", **extra},
        format="json",
    )
    return {**response.json(), "http": response.status_code}


def _tensor_lines(n: int, prefix: str) -> list[dict]:
    return [tensor_line(f"{prefix}{i}", [[1.0, 2.0, 3.0, 4.0]]) for i in range(n)]


def test_priority_is_accepted_up_to_the_allowance_and_shown(api, tenant, quiet):
    created = _create(api, _tensor_lines(2, "a"), "/v2/infer")
    assert created["http"] == 200 and created["priority"] == "normal"  # the tenant's default
    refused = _create(api, _tensor_lines(2, "b"), "/v2/infer", priority="high")
    assert refused["http"] == 400
    assert refused["error"]["param"] == "priority" and "'high'" in refused["error"]["message"]
    Tenant.objects.filter(id=tenant.id).update(max_priority="high")
    high = _create(api, _tensor_lines(2, "c"), "/v2/infer", priority="high")
    assert high["http"] == 200 and high["priority"] == "high"
    assert Batch.objects.get(id=high["id"]).priority == "high"


def test_queue_position_follows_the_serving_order(api, tenant, quiet):
    Tenant.objects.filter(id=tenant.id).update(max_priority="high")
    low = _create(api, _tensor_lines(4, "l"), "/v2/infer", priority="low")
    high = _create(api, _tensor_lines(4, "h"), "/v2/infer", priority="high")
    for created in (low, high):
        assert created["queue"] is None  # still validating: nothing of it is runnable yet
        services.batch_validate(batch_id=created["id"])
    low_now, high_now = api.get(f"/v1/batches/{low['id']}").json(), api.get(f"/v1/batches/{high['id']}").json()
    assert high_now["queue"]["position"] == 1 and low_now["queue"]["position"] == 2
    assert low_now["queue"]["runnable_batches"] == 2
    # Whole seconds from each read's own now, the two reads a moment apart: equal or later, give or take that second.
    assert low_now["queue"]["estimated_start_at"] >= high_now["queue"]["estimated_start_at"] - 1
    assert low_now["queue"]["deadline_at_risk"] is False
    listed = {b["id"]: b["queue"] for b in api.get("/v1/batches").json()["data"]}
    assert listed[low["id"]]["position"] == 2


def test_enqueued_token_quota_fails_the_batch_at_validation(api, tenant, quiet):
    Tenant.objects.filter(id=tenant.id).update(max_enqueued_tokens=50)
    # ~(40 chars ÷ 4 + 2) = 12 estimated tokens a line: 5 lines fit, 10 do not.
    text = "x" * 40
    small = _create(api, [embedding_line(f"s{i}", text) for i in range(4)], "/v1/embeddings")
    services.batch_validate(batch_id=small["id"])
    assert Batch.objects.get(id=small["id"]).status == "in_progress"
    big = _create(api, [embedding_line(f"b{i}", text) for i in range(10)], "/v1/embeddings")
    services.batch_validate(batch_id=big["id"])
    failed = api.get(f"/v1/batches/{big['id']}").json()
    assert failed["status"] == "failed"
    [error] = failed["errors"]["data"]
    assert error["code"] == "token_limit_exceeded" and "over the limit of 50" in error["message"]


def test_polled_positions_reuse_a_recent_ranking_but_rank_a_new_batch_at_once(api, tenant, quiet, monkeypatch):
    """SDK clients poll a running batch: its position comes from a ranking at most QUEUE_INFO_TTL_SECONDS
    old, and a batch that just became runnable is never missing from it."""
    calls = []
    original = selectors.model_ranking

    def counted(**kwargs):
        calls.append(kwargs["model"].name)
        return original(**kwargs)

    monkeypatch.setattr(selectors, "model_ranking", counted)
    first = _create(api, _tensor_lines(4, "f"), "/v2/infer")
    services.batch_validate(batch_id=first["id"])
    for _ in range(5):
        assert api.get(f"/v1/batches/{first['id']}").json()["queue"]["position"] == 1
    assert len(calls) == 1

    second = _create(api, _tensor_lines(4, "s"), "/v2/infer")
    services.batch_validate(batch_id=second["id"])
    assert api.get(f"/v1/batches/{second['id']}").json()["queue"]["position"] == 2
    assert len(calls) == 2

    monkeypatch.setattr(selectors, "QUEUE_INFO_TTL_SECONDS", 0.0)
    api.get(f"/v1/batches/{first['id']}")
    assert len(calls) == 3

"""Demand per LoRA adapter: validation counts each shard's lines per adapter (Shard.adapter_lines, refused lines
left out), the placement loop sums them over open shards, and the base's own demand counts its adapters' lines."""

from __future__ import annotations

import pytest

from controlplane.batches import services
from controlplane.batches.models import Shard, ShardStatus
from controlplane.core.messaging import dispatch
from controlplane.fleet.placement.demand import demand_by_adapter, demand_by_model
from tests.support.batches import jsonl, upload

pytestmark = pytest.mark.django_db
CHAT = "/v1/chat/completions"


def chat(custom_id: str, model: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "count from 1 to 3"}], "max_tokens": 10}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def validated(tenant, models: list[str]) -> str:
    lines = [chat(f"line-{i}", model) for i, model in enumerate(models)]
    batch = services.batch_create(
        tenant=tenant, input_file_id=upload(tenant, jsonl(lines)).id, endpoint=CHAT, completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    return batch.id


def test_shards_count_their_lines_per_adapter_and_demand_sums_the_open_ones(tenant, settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 3
    models = ["tinylm", "tinylm:double", "tinylm:double", "tinylm:reverse", "tinylm:nope", "tinylm", "tinylm:double"]
    batch_id = validated(tenant, models)
    shards = list(Shard.objects.filter(batch_id=batch_id).order_by("index").values_list("adapter_lines", flat=True))
    # The refused tinylm:nope line runs as a 400 on the base: no adapter's demand.
    assert shards == [{"tinylm:double": 2}, {"tinylm:reverse": 1}, {"tinylm:double": 1}]
    assert demand_by_adapter() == {"tinylm": {"double": 3, "reverse": 1}}
    # The batch is the base's: its placement demand counts every line, adapters' included.
    assert demand_by_model()["tinylm"].pending_lines == len(models)

    Shard.objects.filter(batch_id=batch_id, index=0).update(status=ShardStatus.SUCCEEDED)
    assert demand_by_adapter() == {"tinylm": {"double": 1, "reverse": 1}}


def test_a_batch_of_base_lines_only_has_no_adapter_demand(tenant, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    batch_id = validated(tenant, ["tinylm", "tinylm"])
    assert list(Shard.objects.filter(batch_id=batch_id).values_list("adapter_lines", flat=True)) == [None]
    assert demand_by_adapter() == {}

"""Generation usage in OpenAI's shapes: input, cached input and output tokens on the ledger, each at its own
price (cached and output at the input price when the price list does not split them), and
``/v1/organization/usage/completions``. The ledger rows are written as a generation shard's commit writes them
(the shard path itself runs in tests/kinds/test_generation_batch.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.usage.models import UsageRecord
from controlplane.usage.rules import PriceTerms, shard_cost, token_cost
from controlplane.usage.services import ShardUsage, usage_record_shard
from tests.usage.helpers import embedding_lines, price_set, run_batch

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = "/v1/chat/completions"


def _shard(tenant, *, batch_id: str, shard_id: int, tokens: int, cached: int, output: int, completed: int = 2):
    now = timezone.now()
    return usage_record_shard(
        usage=ShardUsage(
            shard_id=shard_id,
            batch_id=batch_id,
            tenant_id=tenant.id,
            endpoint=CHAT,
            model_name="tinylm",
            model_snapshot=None,
            server="local",
            completed=completed,
            failed=0,
            tokens=tokens,
            rows=0,
            started_at=now,
            finished_at=now,
            output_tokens=output,
            cached_tokens=cached,
        )
    )


def test_token_cost_prices_cached_and_output_apart():
    split = PriceTerms(Decimal(2), Decimal(0), Decimal(0), Decimal("0.5"), Decimal(8))
    cost = token_cost(terms=split, tokens=1_000_000, cached_tokens=400_000, output_tokens=250_000)
    assert cost == Decimal("1.2") + Decimal("0.2") + Decimal(2)
    # Without split prices every token is an input token's price (what the ledger did before).
    flat = PriceTerms(Decimal(2), Decimal(0), Decimal(0))
    assert token_cost(terms=flat, tokens=1_000_000, cached_tokens=400_000, output_tokens=250_000) == Decimal("2.5")
    assert shard_cost(terms=flat, tokens=1, rows=0, compute_seconds=0, output_tokens=1) == Decimal("0.000004")
    with pytest.raises(ValueError):
        token_cost(terms=flat, tokens=5, cached_tokens=6)


def test_the_ledger_bills_each_kind_of_token_at_its_price(tenant):
    price_set("tinylm", tokens="1", per_million_cached_tokens=Decimal("0.25"), per_million_output_tokens=Decimal(4))
    record = _shard(tenant, batch_id="batch_a", shard_id=1, tokens=1000, cached=400, output=500)
    assert (record.tokens, record.cached_tokens, record.output_tokens) == (1000, 400, 500)
    assert record.cost == (Decimal(600) * 1 + Decimal(400) * Decimal("0.25") + Decimal(500) * 4) / 10**6


def test_completions_usage_report(tenant, api):
    price_set("tinylm", tokens="1", per_million_output_tokens=Decimal(3))
    _shard(tenant, batch_id="batch_a", shard_id=1, tokens=100, cached=30, output=50, completed=2)
    _shard(tenant, batch_id="batch_a", shard_id=2, tokens=80, cached=0, output=40, completed=3)
    _shard(tenant, batch_id="batch_b", shard_id=3, tokens=10, cached=10, output=5, completed=1)
    run_batch(tenant, embedding_lines(3))  # embeddings usage is not completions usage
    t0 = int(timezone.now().timestamp()) - 3600

    page = api.get("/v1/organization/usage/completions", {"start_time": t0}).json()
    (result,) = [r for b in page["data"] for r in b["results"]]
    assert result["object"] == "organization.usage.completions.result"
    assert (result["input_tokens"], result["input_cached_tokens"], result["output_tokens"]) == (190, 40, 95)
    assert (result["input_audio_tokens"], result["output_audio_tokens"], result["num_model_requests"]) == (0, 0, 6)
    assert result["batch"] is None  # OpenAI's field is set when grouped by batch

    grouped = api.get("/v1/organization/usage/completions", {"start_time": t0, "group_by": "batch,model"}).json()
    by_batch = {r["batch_id"]: r for b in grouped["data"] for r in b["results"]}
    assert set(by_batch) == {"batch_a", "batch_b"}
    assert by_batch["batch_a"]["output_tokens"] == 90 and by_batch["batch_b"]["input_cached_tokens"] == 10
    assert all(r["batch"] is True and r["model"] == "tinylm" for r in by_batch.values())

    costs = api.get("/v1/organization/costs", {"start_time": t0, "group_by": "line_item", "models": "tinylm"}).json()
    items = {r["line_item"]: Decimal(r["amount"]["exact"]) for b in costs["data"] for r in b["results"]}
    assert items["tinylm, output tokens"] == Decimal(95 * 3) / 10**6
    assert items["tinylm, tokens"] == Decimal(190) / 10**6
    assert sum(items.values()) == sum(r.cost for r in UsageRecord.objects.filter(model="tinylm"))

    csv_text = api.get("/v1/organization/usage/completions", {"start_time": t0, "format": "csv"}).content.decode()
    header, row = csv_text.splitlines()[:2]
    columns = dict(zip(header.split(","), row.split(","), strict=True))
    assert (columns["input_tokens"], columns["input_cached_tokens"], columns["output_tokens"]) == ("190", "40", "95")

"""The usage ledger on the running stack: a real batch's ledger rows total its usage, and the tenant reads
them back through the openai SDK's organization usage call; a tenant reaching its spend cap mid-batch stops."""

from __future__ import annotations

import csv
import io
import time

import pytest
from openai import OpenAI

from tests.e2e.test_batchctl import batchctl
from tests.support.stack import assert_exactly_once, embedding_lines, submit, wait_for_running_shard

pytestmark = pytest.mark.e2e


def test_a_batch_lands_in_the_ledger_and_the_usage_report(e2e):
    key = e2e.new_tenant(f"usage-{time.time_ns()}")
    client = e2e.sdk(key)
    started = int(time.time()) - 1
    lines = embedding_lines(30, seed=7, prefix="u")
    batch = e2e.wait_status(client, submit(client, lines).id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    [(rows, shards, completed, failed, tokens, keys)] = e2e.sql(
        "SELECT count(*), count(DISTINCT shard_id), sum(completed_lines), sum(failed_lines), sum(tokens),"
        " count(DISTINCT api_key_id) FROM usage_usagerecord WHERE batch_id = %s",
        batch.id,
    )
    [(shard_count,)] = e2e.sql("SELECT count(*) FROM batches_shard WHERE batch_id = %s", batch.id)
    assert rows == shards == shard_count >= 1
    assert (completed, failed) == (batch.request_counts.completed, batch.request_counts.failed) == (30, 0)
    assert tokens == batch.usage.input_tokens > 0
    assert keys == 1  # the key that created the batch
    # The SDK's admin call, with the tenant's own key (brackets for arrays, as the SDK sends them).
    admin = OpenAI(base_url=e2e.base_url, api_key=key, admin_api_key=key, max_retries=0, timeout=60)
    page = admin.admin.organization.usage.embeddings(
        start_time=started, bucket_width="1m", group_by=["model"]
    ).to_dict()
    while page.get("has_more"):
        nxt = admin.admin.organization.usage.embeddings(
            start_time=started, bucket_width="1m", group_by=["model"], page=page["next_page"]
        ).to_dict()
        page = {**nxt, "data": page["data"] + nxt["data"]}
    results = [r for bucket in page["data"] for r in bucket["results"]]
    assert sum(r["input_tokens"] for r in results) == tokens
    assert sum(r["num_model_requests"] for r in results) == 30
    assert {r["model"] for r in results} == {lines[0]["body"]["model"]}
    assert client.batches.retrieve(batch.id).model_extra["cost"]["currency"] == "usd"
    # batchctl, the console script, reads the same report.
    shown = batchctl(
        e2e, "usage", "--start", str(started), "--bucket-width", "1h", "--group-by", "batch", "--csv", api_key=key
    )
    assert shown.returncode == 0, shown.stderr
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert {r["batch_id"] for r in rows} == {batch.id}
    assert sum(int(r["input_tokens"]) for r in rows) == tokens


def test_a_tenant_at_its_spend_cap_mid_batch_ends_it_with_spend_cap_exceeded_lines(e2e):
    name = f"cap-{time.time_ns()}"
    client = e2e.sdk(e2e.new_tenant(name))
    lines = embedding_lines(480, seed=14, prefix="cap")
    batch = submit(client, lines)
    wait_for_running_shard(e2e, batch.id)
    e2e.tenant_update(name, "monthly_spend_cap = 0")  # reached at once: the month's cost is at least 0
    batch = e2e.wait_status(client, batch.id, {"expired", "completed"}, timeout_s=60)
    assert batch.status == "expired" and batch.errors.data[0].code == "spend_cap_exceeded", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert output, "lines finished before the cap must stay downloadable"
    assert errors and {e["error"]["code"] for e in errors} == {"spend_cap_exceeded"}

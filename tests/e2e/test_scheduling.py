"""The scheduler through the real stack: fair share between tenants, priority classes, deadline promotion,
admission quotas and pausing a tenant.

Every ordering claim is checked against the database's own record (``shard_claimed`` BatchEvent rows and
the batches' timestamps), not against the test's polling clock. The e2e stack runs shards of at most 16
lines (SHARD_MAX_LINES=16), two dispatch slots for the identity model (one Triton, 6 calls ÷ 3 per shard),
and accepts ``8s`` and ``20s`` completion windows."""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import openai
import pytest

from tests.support.stack import assert_exactly_once, submit, tensor_lines

pytestmark = pytest.mark.e2e

TENSORS = "/v2/infer"
WINDOW = "20s"  # the deadline-promotion batch's completion window (tests/e2e/conftest.py allows it)


def _tenant(e2e, role: str, **fields: object):
    """A new tenant (unique name) with its columns set by SQL, and an SDK client for it."""
    name = f"sched-{role}-{uuid.uuid4().hex[:6]}"
    key = e2e.new_tenant(name)
    for column, value in fields.items():  # column names come from this file, never from input
        e2e.tenant_update(name, f"{column}=%s", value)
    return name, e2e.sdk(key)


def _claims(e2e, batch_id: str, *, first_attempts: bool = False) -> list[datetime]:
    """When each shard of the batch was claimed, oldest first (one row per claim, retries included unless
    ``first_attempts``: the claim event's message is "attempt N by <owner>")."""
    retries = "" if not first_attempts else " AND message LIKE 'attempt 1 %%'"
    return [
        row[0]
        for row in e2e.sql(
            "SELECT created_at FROM batches_batchevent WHERE batch_id=%s AND kind='shard_claimed'"
            + retries
            + " ORDER BY created_at, id",
            batch_id,
        )
    ]


def _wait_claims(e2e, batch_id: str, at_least: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(_claims(e2e, batch_id)) >= at_least:
            return
        time.sleep(0.02)
    raise AssertionError(f"batch {batch_id}: fewer than {at_least} shards claimed after {timeout_s}s")


def _times(e2e, batch_id: str) -> dict[str, datetime | None]:
    created, completed, expires = e2e.sql(
        "SELECT created_at, completed_at, expires_at FROM batches_batch WHERE id=%s", batch_id
    )[0]
    return {"created": created, "completed": completed, "expires": expires}


def _pending_shards(e2e, batch_id: str) -> int:
    return e2e.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s AND status='pending'", batch_id)[0][0]


def _identity_slots(e2e) -> int:
    """identity's dispatch slots now (scheduling/selectors.py `model_slot_cap`): ready instances ×
    SCHEDULER_CALLS_PER_INSTANCE (6) ÷ DISPATCH_INFLIGHT_CALLS (3), the stack's defaults."""
    [(instances,)] = e2e.sql(
        "SELECT coalesce(sum(p.instances), 0) FROM fleet_placement p JOIN fleet_cataloguemodel m ON m.id=p.model_id "
        "WHERE m.name='identity' AND p.status='ready'"
    )
    return max(1, int(instances or 1) * 6 // 3)


def _claims_after(e2e, batch_id: str, moment: datetime) -> int:
    return sum(1 for claimed in _claims(e2e, batch_id) if claimed > moment)


def _timeline(e2e, *batch_ids: str) -> str:
    """What a failed ordering check shows: the batches' state changes, and their shard claims per 0.25 s,
    in seconds from the first event (batches named A, B, … in argument order)."""
    rows = e2e.sql(
        "SELECT created_at, batch_id, kind, message FROM batches_batchevent WHERE batch_id = ANY(%s) "
        "AND kind <> 'shard_succeeded' ORDER BY created_at, id",
        list(batch_ids),
    )
    if not rows:
        return "(no events)"
    start, names = rows[0][0], {batch_id: chr(ord("A") + i) for i, batch_id in enumerate(batch_ids)}
    lines, buckets = [], {}
    for at, batch_id, kind, message in rows:
        seconds = (at - start).total_seconds()
        if kind == "shard_claimed":
            counts = buckets.setdefault(int(seconds * 4) / 4, dict.fromkeys(names.values(), 0))
            counts[names[batch_id]] += 1
            if not message.startswith("attempt 1 "):  # a retry's claim: shown on its own line
                lines.append(f"{seconds:7.2f}s {names[batch_id]} claimed again ({message})")
        else:
            lines.append(f"{seconds:7.2f}s {names[batch_id]} {kind}")
    lines += [f"{t:6.2f}s+ claims " + " ".join(f"{n}={c}" for n, c in counts.items()) for t, counts in buckets.items()]
    return "\n".join(lines)


def test_small_tenant_is_served_before_another_tenants_flood_finishes(e2e):
    _, flood_client = _tenant(e2e, "flood")
    _, small_client = _tenant(e2e, "small")
    flood_lines, small_lines = tensor_lines(3000, prefix="flood"), tensor_lines(20, prefix="small")
    flood = submit(flood_client, flood_lines, endpoint=TENSORS)
    e2e.wait_status(flood_client, flood.id, {"in_progress"}, timeout_s=60)
    _wait_claims(e2e, flood.id, 1)
    small = submit(small_client, small_lines, endpoint=TENSORS)

    # Hang guards, not speed limits (the order is what is asserted): a 3,000-line flood took over 120 s beside a
    # CPU hog at load 20 (2026-12-02).
    small = e2e.wait_status(small_client, small.id, {"completed", "failed"}, timeout_s=300)
    assert small.status == "completed", small.errors
    # A still had shards waiting when B was done: B did not wait for A's backlog.
    assert _pending_shards(e2e, flood.id) > 0, f"A = flood, B = small:\n{_timeline(e2e, flood.id, small.id)}"

    flood = e2e.wait_status(flood_client, flood.id, {"completed", "failed"}, timeout_s=600)
    assert flood.status == "completed", flood.errors
    small_times, flood_times = _times(e2e, small.id), _times(e2e, flood.id)
    assert flood_times["created"] < small_times["created"]
    assert small_times["completed"] < flood_times["completed"]
    shards = e2e.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s", flood.id)[0][0]
    later_flood_claims = _claims_after(e2e, flood.id, small_times["completed"])
    # B overtook a real backlog (at least a quarter of A's shards ran after it), not just A's last shards.
    assert later_flood_claims >= shards // 4, (
        f"only {later_flood_claims} of the flood's {shards} shards ran after the small batch completed; "
        f"A = flood, B = small batch:\n{_timeline(e2e, flood.id, small.id)}"
    )
    assert_exactly_once(small_client, small, small_lines)
    assert_exactly_once(flood_client, flood, flood_lines)


def test_high_priority_batch_submitted_after_a_low_one_finishes_first(e2e):
    _, client = _tenant(e2e, "prio", max_priority="high")
    _, normal_only = _tenant(e2e, "capped")  # max_priority defaults to normal
    with pytest.raises(openai.BadRequestError) as refused:
        submit(normal_only, tensor_lines(4, prefix="refused"), endpoint=TENSORS, priority="high")
    assert refused.value.body["code"] == "priority_not_allowed"

    low_lines, high_lines = tensor_lines(1500, prefix="low"), tensor_lines(100, prefix="high")
    low = submit(client, low_lines, endpoint=TENSORS, priority="low")
    assert low.priority == "low"
    e2e.wait_status(client, low.id, {"in_progress"}, timeout_s=60)
    _wait_claims(e2e, low.id, 1)
    high = submit(client, high_lines, endpoint=TENSORS, priority="high")
    assert high.priority == "high"

    high = e2e.wait_status(client, high.id, {"completed", "failed"}, timeout_s=60)
    assert high.status == "completed", high.errors
    assert _pending_shards(e2e, low.id) > 0, f"A = low, B = high:\n{_timeline(e2e, low.id, high.id)}"
    # Classes are strict: from the moment the high batch was runnable until its last shard was claimed, the
    # low one may only get the claims already under way (one per slot; two slots here).
    high_runnable = e2e.sql("SELECT in_progress_at FROM batches_batch WHERE id=%s", high.id)[0][0]
    high_last_claim = _claims(e2e, high.id)[-1]
    low_meanwhile = sum(1 for at in _claims(e2e, low.id) if high_runnable < at < high_last_claim)
    assert low_meanwhile <= 2, (
        f"{low_meanwhile} low shards were claimed while the high batch had shards waiting; "
        f"A = low, B = high:\n{_timeline(e2e, low.id, high.id)}"
    )
    low = e2e.wait_status(client, low.id, {"completed", "failed"}, timeout_s=600)  # a hang guard (see above)
    assert low.status == "completed", low.errors
    high_done = _times(e2e, high.id)["completed"]
    assert high_done < _times(e2e, low.id)["completed"]
    shards = e2e.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s", low.id)[0][0]
    # Once the high batch was runnable, the low one only got what the high one could not use.
    assert _claims_after(e2e, low.id, high_done) >= shards // 4, (
        f"A = low, B = high:\n{_timeline(e2e, low.id, high.id)}"
    )
    assert_exactly_once(client, high, high_lines)
    assert_exactly_once(client, low, low_lines)


def test_batch_near_its_deadline_is_promoted_over_a_normal_flood(e2e):
    _, flood_client = _tenant(e2e, "dflood")
    _, client = _tenant(e2e, "deadline")
    # Two batches of 8,000 lines (one file is at most FILE_MAX_BYTES, 2 MiB here): the flood outlasts the window.
    flood_lines = [tensor_lines(8000, prefix=f"dflood{i}") for i in range(2)]
    floods = [submit(flood_client, lines, endpoint=TENSORS) for lines in flood_lines]
    flood = floods[0]
    e2e.wait_status(flood_client, flood.id, {"in_progress"}, timeout_s=60)
    _wait_claims(e2e, flood.id, 8)  # a few flood shards settled: the model's speed is measured
    # Sized from the scheduler's own estimate (throughput = 2 slots ÷ measured seconds per row) to need
    # about 6 s of the model: it turns urgent once that is more than half the time left
    # (SCHEDULER_DEADLINE_FRACTION = 0.5), i.e. with ~12 s of its 20 s window left — validated by then even on a
    # loaded host (an 8 s window ran out in validation at load 18) — and then needs ~8 s (dispatch between
    # shards costs ~25 %). Its lines have the flood's shape, so its own shards do not skew the measured speed.
    # As a LOW batch behind a NORMAL flood it would otherwise wait for the whole flood (~30 s here) and expire.
    seconds_per_row = e2e.sql("SELECT seconds_per_work_unit FROM fleet_cataloguemodel WHERE name='identity'")[0][0]
    urgent_lines = tensor_lines(max(50, min(8000, int(6.0 * 2 / seconds_per_row))), prefix="urgent")
    urgent = submit(client, urgent_lines, endpoint=TENSORS, window=WINDOW, priority="low")

    urgent = e2e.wait_status(client, urgent.id, {"completed", "expired", "failed"}, timeout_s=60)
    timeline = f"A, B = flood, C = urgent:\n{_timeline(e2e, *(f.id for f in floods), urgent.id)}"
    # The scheduler's promise, read from its own claim records: a LOW batch behind a NORMAL flood is claimed
    # at all only once promoted, and from then on every slot that frees goes to it until its shards are out,
    # while the flood still has work waiting.
    # First attempts only: a shard given back (a lease that ran out on a loaded host) is pending again only once
    # rescued, and until then a freed slot rightly goes to the flood.
    urgent_claims = _claims(e2e, urgent.id, first_attempts=True)
    flood_claims = sorted(c for f in floods for c in _claims(e2e, f.id))
    assert urgent_claims, f"{urgent.status}: never claimed, so never promoted; {timeline}"
    first, last = urgent_claims[0], urgent_claims[-1]
    # Claims are decided concurrently, one per slot: at the promotion a claim already deciding may still take a
    # flood shard (urgency is judged at claim time; the sticky stamp lands after the promoting claim commits),
    # and at the end a claim that finds the promoted batch's last shard row-locked by another slot's claim
    # rightly skips to the flood while that claim commits. So at most slots - 1 flood claims may sit among the
    # first `slots` and among the last `slots` of the promoted batch's claims; none in between.
    slots = _identity_slots(e2e)
    head_end = urgent_claims[min(slots, len(urgent_claims)) - 1]
    tail_start = urgent_claims[max(len(urgent_claims) - slots, 0)]
    head = [c for c in flood_claims if first < c < head_end]
    tail = [c for c in flood_claims if tail_start < c < last and c >= head_end]
    interior = [c for c in flood_claims if head_end < c < tail_start]
    assert not interior and len(head) < slots and len(tail) < slots, (
        f"{len(head)} + {len(interior)} + {len(tail)} flood shards claimed while the promoted batch waited "
        f"({slots} slots); {timeline}"
    )
    assert any(c > last for c in flood_claims) or sum(_pending_shards(e2e, f.id) for f in floods) > 0, (
        f"the flood had nothing left when the urgent batch ran: it was served after, not ahead; {timeline}"
    )
    # Completion inside the window is the goal and what a quiet host shows; on a loaded one the window (wall clock,
    # from creation) can run out while the promoted batch runs, so the outcome is reported and must be clean.
    times = _times(e2e, urgent.id)
    print(
        f"deadline promotion: {len(urgent_lines)} lines, first claim {(first - times['created']).total_seconds():.2f}s "
        f"after create, {urgent.status} {((times['completed'] or times['expires']) - times['created']).total_seconds():.2f}s "
        f"after create (window {WINDOW})"
    )
    # A batch still running at its expires_at is stopped by the next expiry sweep, not at that instant: a shard
    # claimed just before (or, with the sweep behind on a loaded host, just after) may finish it as completed a
    # moment past its window (seen: 1.0 s, 2026-12-04). The product promises the sweep, not the instant.
    assert urgent.status in ("completed", "expired"), f"{urgent.status}: {urgent.request_counts}; {timeline}"
    assert_exactly_once(client, urgent, urgent_lines)

    # The rest of the flood proves nothing more: cancel it, and nothing may be lost or doubled.
    for f, lines in zip(floods, flood_lines, strict=True):
        flood_client.batches.cancel(f.id)
        assert_exactly_once(flood_client, e2e.wait_status(flood_client, f.id, {"cancelled", "completed"}, 60), lines)


def test_over_quota_create_is_429_with_retry_after_and_creates_nothing(e2e):
    name, client = _tenant(e2e, "quota", max_enqueued_lines=10)
    tenant_batches = "SELECT count(*) FROM batches_batch b JOIN tenants_tenant t ON t.id=b.tenant_id WHERE t.name=%s"
    before = e2e.sql(tenant_batches, name)[0][0]
    with pytest.raises(openai.RateLimitError) as caught:
        submit(client, tensor_lines(20, prefix="over"), endpoint=TENSORS)
    response = caught.value.response
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-limit-enqueued-lines"] == "10"
    assert response.headers["x-ratelimit-remaining-enqueued-lines"] == "10"
    assert response.headers["x-ratelimit-reset-enqueued-lines"].endswith("s")
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "enqueued_lines_limit_exceeded"
    assert error["limit"]["name"] == "max_enqueued_lines"
    assert (error["limit"]["value"], error["limit"]["current"]) == (10, 0)
    assert e2e.sql(tenant_batches, name)[0][0] == before, "a refused create must not leave a batch behind"

    # At the limit exactly is allowed, and runs.
    lines = tensor_lines(10, prefix="fits")
    batch = e2e.wait_status(client, submit(client, lines, endpoint=TENSORS).id, {"completed", "failed"}, timeout_s=60)
    assert batch.status == "completed", batch.errors
    assert e2e.sql(tenant_batches, name)[0][0] == before + 1
    assert_exactly_once(client, batch, lines)


def test_paused_tenant_is_not_dispatched_and_resumes_exactly_once(e2e):
    name, client = _tenant(e2e, "pause")
    lines = tensor_lines(800, prefix="pause")
    batch = submit(client, lines, endpoint=TENSORS)
    e2e.wait_status(client, batch.id, {"in_progress"}, timeout_s=60)
    _wait_claims(e2e, batch.id, 2)

    e2e.tenant_update(name, "paused=true")
    # A claim already inside its transaction when the pause committed may still land; after a short grace
    # nothing new may start, and the shards that were running finish.
    time.sleep(1.0)
    claimed_at_pause = len(_claims(e2e, batch.id))
    time.sleep(3.0)
    assert len(_claims(e2e, batch.id)) == claimed_at_pause, "a shard was claimed while the tenant was paused"
    assert e2e.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s AND status='running'", batch.id)[0][0] == 0
    assert _pending_shards(e2e, batch.id) > 0, "the batch finished before the pause took effect; make it larger"
    assert client.batches.retrieve(batch.id).status == "in_progress"

    e2e.tenant_update(name, "paused=false")
    # No top-up is asked for here: beat's (every SCHEDULER_TOPUP_INTERVAL_SECONDS) must pick the work up. A hang
    # guard, not a speed limit: the rest of the 800 lines took over 60 s beside a mutation run at load 29.
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"}, timeout_s=300)
    assert batch.status == "completed", batch.errors
    assert len(_claims(e2e, batch.id)) > claimed_at_pause
    output, errors = assert_exactly_once(client, batch, lines)
    assert errors == [] and len(output) == 800

"""Claims by policy on real Postgres: one winner per shard under contention, fair share between
tenants, priorities, pauses and deferrals."""

from __future__ import annotations

import math
import os
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.batches.models import Batch, BatchEvent, Shard, ShardStatus
from controlplane.core import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from controlplane.scheduling.models import TenantShare
from controlplane.tenants.models import Tenant
from tests.batches.helpers import embedding_line, jsonl, upload
from tests.scheduling.helpers import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet(settings, monkeypatch, catalogue):
    # The tests drive claims themselves; nothing goes to the broker.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    settings.SCHEDULER_AGING_SECONDS = 3600.0


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def _claim_tenants(n: int) -> list[str]:
    order = []
    for _ in range(n):
        shard = shard_claim_next(model=_identity(), owner="t")
        assert shard is not None
        order.append(shard.batch.tenant.name)
    return order


def test_two_claimers_never_win_the_same_shard(quiet):
    """1,000 rounds: two threads released together by a barrier race for the one runnable shard (CLAIM_RACE_ROUNDS:
    fewer in `make test-fast`, the edit loop)."""
    rounds = int(os.environ.get("CLAIM_RACE_ROUNDS", "1000"))
    tenant = new_tenant("race")
    batch = runnable_batch(tenant, rounds * 2)  # 1,000 shards of two lines
    shard_ids = list(Shard.objects.filter(batch=batch).order_by("index").values_list("id", flat=True))
    far = timezone.now() + timedelta(days=1)
    Shard.objects.filter(batch=batch).update(not_before=far)
    model = _identity()
    barrier = threading.Barrier(2)
    results: list[list[int | None]] = [[], []]

    def claimer(slot: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()  # round starts: the main thread made exactly one shard runnable
                shard = shard_claim_next(model=model, owner=f"w{slot}")
                results[slot].append(shard.id if shard else None)
                barrier.wait()  # round ends
        finally:
            connection.close()

    control = threading.Barrier(3)
    barrier = control  # main thread joins each wait so it can open one shard per round
    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for shard_id in shard_ids:
        Shard.objects.filter(id=shard_id).update(not_before=None)
        control.wait()
        control.wait()
    for thread in threads:
        thread.join()
    for round_no, shard_id in enumerate(shard_ids):
        won = [r[round_no] for r in results if r[round_no] is not None]
        assert won == [shard_id], f"round {round_no}: {won}"
    assert set(Shard.objects.filter(batch=batch).values_list("status", flat=True)) == {ShardStatus.RUNNING}
    assert set(Shard.objects.filter(batch=batch).values_list("attempt", flat=True)) == {1}


def test_a_newcomer_is_served_at_the_next_claim(quiet):
    flood = new_tenant("flood")
    runnable_batch(flood, 40, prefix="a")
    assert _claim_tenants(5) == ["flood"] * 5
    newcomer = new_tenant("newcomer")
    runnable_batch(newcomer, 6, prefix="b")
    # The newcomer starts at the system clock, below the flooding tenant: it gets the next slot, then
    # the two alternate (equal weights, equal shard sizes).
    assert _claim_tenants(6) == ["newcomer", "flood", "newcomer", "flood", "newcomer", "flood"]


def test_weights_split_claims(quiet):
    heavy = new_tenant("heavy", weight=3.0)
    light = new_tenant("light", weight=1.0)
    runnable_batch(heavy, 80, prefix="h")
    runnable_batch(light, 80, prefix="l")
    order = _claim_tenants(40)
    assert order.count("heavy") == 30 and order.count("light") == 10
    shares = {s.tenant.name: s.served_work_units for s in TenantShare.objects.select_related("tenant")}
    assert shares == {"heavy": 60.0, "light": 20.0}


def test_high_priority_overtakes_and_low_waits(quiet):
    tenant = new_tenant("prio", max_priority="high")
    low = runnable_batch(tenant, 4, prefix="l", priority="low")
    normal = runnable_batch(tenant, 4, prefix="n", priority="normal")
    high = runnable_batch(tenant, 4, prefix="h", priority="high")
    order = [shard_claim_next(model=_identity(), owner="t").batch_id for _ in range(6)]
    assert order == [high.id, high.id, normal.id, normal.id, low.id, low.id]
    assert shard_claim_next(model=_identity(), owner="t") is None


def test_paused_tenant_and_model_and_deferred_shards_are_not_claimed(quiet):
    tenant = new_tenant("paused")
    batch = runnable_batch(tenant, 4)
    Tenant.objects.filter(id=tenant.id).update(paused=True)
    assert shard_claim_next(model=_identity(), owner="t") is None
    Tenant.objects.filter(id=tenant.id).update(paused=False)
    CatalogueModel.objects.filter(name="identity").update(paused=True)
    assert shard_claim_next(model=_identity(), owner="t") is None
    CatalogueModel.objects.filter(name="identity").update(paused=False)
    Shard.objects.filter(batch=batch).update(not_before=timezone.now() + timedelta(minutes=1))
    assert shard_claim_next(model=_identity(), owner="t") is None
    Shard.objects.filter(batch=batch, index=1).update(not_before=timezone.now() - timedelta(seconds=1))
    claimed = shard_claim_next(model=_identity(), owner="t")
    assert claimed is not None and claimed.index == 1 and claimed.not_before is None
    assert Batch.objects.get(id=batch.id).last_dispatched_at is not None


def test_batch_at_deadline_risk_is_promoted(quiet, settings):
    tenant = new_tenant("deadline", max_priority="high")
    high = runnable_batch(tenant, 6, prefix="h", priority="high")
    low = runnable_batch(tenant, 6, prefix="l", priority="low")
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=4.0)  # 2 slots: 0.5 rows/s
    assert shard_claim_next(model=_identity(), owner="t").batch_id == high.id  # an hour left: no risk
    # The low batch's remaining rows (12 s of work) need more than half of the 10 s it has left.
    Batch.objects.filter(id=low.id).update(expires_at=timezone.now() + timedelta(seconds=10))
    assert shard_claim_next(model=_identity(), owner="t").batch_id == low.id
    promoted = BatchEvent.objects.filter(kind="deadline_promoted").values_list("batch_id", flat=True)
    assert list(promoted) == [low.id]  # the audit trail says why it overtook the high batch, once


def test_fifo_policy_serves_the_oldest_batch_first(quiet, settings):
    settings.SCHEDULER_POLICY = "fifo"
    first, second = new_tenant("first"), new_tenant("second", max_priority="high")
    older = runnable_batch(first, 6, prefix="a")
    runnable_batch(second, 6, prefix="b", priority="high")
    assert [shard_claim_next(model=_identity(), owner="t").batch_id for _ in range(3)] == [older.id] * 3


def test_deadline_promotion_sticks_until_the_batch_is_done(quiet):
    tenant = new_tenant("sticky")
    flood = runnable_batch(tenant, 8, prefix="f")
    late = runnable_batch(tenant, 6, prefix="l", priority="low")
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=4.0)  # 0.5 rows/s
    Batch.objects.filter(id=late.id).update(expires_at=timezone.now() + timedelta(seconds=20))
    # 6 rows need 12 s > 0.5 × 20 s: promoted. After one shard 4 rows need 8 s < 10 s — no longer at
    # risk by the formula, but the promotion sticks, so the batch keeps the slot until it is done.
    assert [shard_claim_next(model=_identity(), owner="t").batch_id for _ in range(3)] == [late.id] * 3
    assert Batch.objects.get(id=late.id).deadline_promoted_at is not None
    assert shard_claim_next(model=_identity(), owner="t").batch_id == flood.id
    assert Batch.objects.get(id=flood.id).deadline_promoted_at is None


def test_a_busy_batch_row_does_not_hide_its_shards(quiet):
    """The claim locks only the shard row (FOR UPDATE OF self): while a commit holds the batch row for its
    counts, a concurrent claim must still find and take the batch's shard."""
    import time

    import psycopg

    batch = runnable_batch(new_tenant("busy"), 4)
    db = connection.settings_dict
    params = {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"], "dbname": db["NAME"]}
    holder = psycopg.connect(**params)
    observer = psycopg.connect(**params, autocommit=True)
    claimed: list[Shard | None] = []

    def claim() -> None:
        try:
            claimed.append(shard_claim_next(model=_identity(), owner="t"))
        finally:
            connection.close()

    try:
        holder.execute("UPDATE batches_batch SET completed_lines = completed_lines WHERE id = %s", (batch.id,))
        thread = threading.Thread(target=claim)
        thread.start()
        # The claim itself commits while the batch row is held (only its later timestamp update waits).
        deadline = time.monotonic() + 10
        running = 0
        while time.monotonic() < deadline and not running:
            running = observer.execute(
                "SELECT count(*) FROM batches_shard WHERE batch_id = %s AND status = 'running'", (batch.id,)
            ).fetchone()[0]
            time.sleep(0.05)
        assert running == 1
    finally:
        holder.rollback()
        holder.close()
        observer.close()
    thread.join(10)
    assert claimed and claimed[0] is not None and claimed[0].batch_id == batch.id


def test_the_speed_estimate_counts_what_a_shard_cost_its_slot(quiet):
    """shard_settle folds the slot's whole cycle (claim and commit included) into seconds per work unit when
    the runner measured it, else the shard's own started → finished."""
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    tenant = new_tenant("speed")
    runnable_batch(tenant, 10)  # five shards of two rows

    def settled(cycle_seconds):
        shard = shard_claim_next(model=_identity(), owner="t")
        assert shard_commit(
            shard_id=shard.id, attempt=shard.attempt, summary=PartSummary("p", 2, 0, TokenCounts(), False)
        )
        shard_settle(shard_id=shard.id, cycle_seconds=cycle_seconds)
        return _identity().seconds_per_work_unit

    # With no estimate yet (0), the first measurement is taken as it is: 2 rows in a 2 s cycle, 1 s a row.
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=0.0)
    assert settled(2.0) == pytest.approx(1.0)
    # From an estimate of 0.5, 1 s a row is smoothed (0.3) → 0.65.
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=0.5)
    assert settled(2.0) == pytest.approx(0.3 * 1.0 + 0.7 * 0.5)
    # 2 rows in 100 s: 50 s a row, but one shard moves the estimate by at most 4× (a cold start, say).
    assert settled(100.0) == pytest.approx(0.3 * (4 * 0.65) + 0.7 * 0.65)
    before = _identity().seconds_per_work_unit
    assert settled(0.02) == pytest.approx(0.3 * (before / 4) + 0.7 * before)  # and down by at most 4×
    # Without a cycle, the shard's own (instant) run pulls the estimate down (by at most 4× a step).
    before = _identity().seconds_per_work_unit
    assert settled(None) < before


def test_the_calls_time_is_folded_into_the_figure_shards_are_cut_by_and_the_cycle_into_the_other(quiet):
    """model_seconds (the calls in flight, scheduling/call_clock.py) moves model_seconds_per_work_unit; the
    cycle moves seconds_per_work_unit; neither touches the other, and no model_seconds leaves it alone."""
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    runnable_batch(new_tenant("calls"), 10)  # five shards of two rows
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=0.5, model_seconds_per_work_unit=0)

    def settled(cycle_seconds, model_seconds):
        shard = shard_claim_next(model=_identity(), owner="t")
        assert shard_commit(
            shard_id=shard.id, attempt=shard.attempt, summary=PartSummary("p", 2, 0, TokenCounts(), False)
        )
        shard_settle(shard_id=shard.id, cycle_seconds=cycle_seconds, model_seconds=model_seconds)
        model = _identity()
        return model.seconds_per_work_unit, model.model_seconds_per_work_unit

    # Unmeasured (0): the first calls' time is taken as it is, 0.02 s for 2 rows.
    assert settled(2.0, 0.02) == pytest.approx((0.3 * 1.0 + 0.7 * 0.5, 0.01))
    _, calls = settled(2.0, 0.04)
    assert calls == pytest.approx(0.3 * 0.02 + 0.7 * 0.01)
    assert settled(2.0, None)[1] == calls  # a generation stream, or no call: not measured


def test_shards_cut_by_their_calls_time_stay_large_when_the_cycle_is_mostly_fixed_cost(quiet, monkeypatch):
    """The loop a loaded host runs: validation cuts shards by the estimate, each shard's cycle costs 1.2 s of
    claim, reading, writing and commit whatever its size plus 1 ms a row, and settling feeds the estimate back.
    Cut by the cycle, shards shrink to the 4-row floor and stay there; cut by the calls' time (20 ms a call plus
    1 ms a row), they settle far above it."""
    from controlplane.batches.intake.validation import shard_seconds_per_unit
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    fixed_s, call_s, row_s, target_s, floor, cap = 1.2, 0.02, 0.001, 1.0, 4, 4096

    runnable_batch(new_tenant("loop"), 240)  # 120 shards of two rows, each settled below as a shard of `rows`

    def steady_size(timed_calls: bool) -> int:
        CatalogueModel.objects.filter(name="identity").update(
            seconds_per_work_unit=row_s, model_seconds_per_work_unit=0.0
        )
        rows = cap
        for _ in range(60):  # the cycle-cut loop reaches the floor at about the 60th shard from 1,000 rows
            rows = min(cap, max(floor, int(target_s / shard_seconds_per_unit(_identity()))))
            shard = shard_claim_next(model=_identity(), owner="t")
            assert shard_commit(
                shard_id=shard.id, attempt=shard.attempt, summary=PartSummary("p", 2, 0, TokenCounts(), False)
            )
            Shard.objects.filter(id=shard.id).update(work_units=rows)  # as validation would have cut it
            model_seconds = call_s + rows * row_s if timed_calls else None
            shard_settle(shard_id=shard.id, cycle_seconds=fixed_s + rows * row_s, model_seconds=model_seconds)
        return rows

    assert steady_size(timed_calls=False) == floor
    assert steady_size(timed_calls=True) >= 900  # 20 ms of fixed cost a call: ~980 rows


# Measured above and below the estimate; a weight under 1; a weight of 0, which Tenant.clean refuses but a
# plain UPDATE can write: it is charged as the smallest weight (1e-6) rather than failing every claim.
@pytest.mark.parametrize(("weight", "delta"), [(2.0, 7), (0.5, -3), (0.0, 7)])
def test_settling_a_text_shard_corrects_the_charge_by_measured_minus_estimated(quiet, settings, weight, delta):
    """A text shard is charged its estimated work units at claim; when it settles with the tokenizer's count,
    shard_settle moves the tenant's virtual time by (measured - estimated) / weight and its served work to the
    measured count."""
    from controlplane.batches import services
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    settings.SCHEDULER_HALF_LIFE_SECONDS = math.inf  # nothing decays between the claim and the settle
    tenant = new_tenant("tokens", weight=weight)
    charged_weight = max(weight, 1e-6)
    file = upload(tenant, jsonl([embedding_line(f"e{i}", f"a few words, line {i}") for i in range(2)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h", priority=None
    )
    services.batch_validate(batch_id=batch.id)
    shard = shard_claim_next(model=CatalogueModel.objects.get(name="all-MiniLM-L6-v2"), owner="t")
    assert shard is not None and shard.work_units > 3
    charged = TenantShare.objects.get(tenant_id=tenant.id)
    assert charged.served_work_units == shard.work_units
    # The first claim: the system clock starts at 0.
    assert charged.vtime == pytest.approx(shard.work_units / charged_weight)
    measured = shard.work_units + delta
    summary = PartSummary("p", 2, 0, TokenCounts(input=measured), False)
    assert shard_commit(shard_id=shard.id, attempt=shard.attempt, summary=summary)

    shard_settle(shard_id=shard.id)

    settled = TenantShare.objects.get(tenant_id=tenant.id)
    assert settled.served_work_units == measured
    assert settled.vtime == pytest.approx(charged.vtime + delta / charged_weight)


def test_settling_folds_completion_per_choice_into_the_models_expectation(quiet):
    """The first settled shard with choices sets the model's expected completion per choice; later ones are
    smoothed into it (0.3 of the new mean)."""
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    runnable_batch(new_tenant("choices"), 4)  # two shards of two rows
    CatalogueModel.objects.filter(name="identity").update(expected_completion_tokens=None)

    def settled(tokens: TokenCounts) -> float | None:
        shard = shard_claim_next(model=_identity(), owner="t")
        assert shard_commit(shard_id=shard.id, attempt=shard.attempt, summary=PartSummary("p", 2, 0, tokens, False))
        shard_settle(shard_id=shard.id)
        return _identity().expected_completion_tokens

    assert settled(TokenCounts(output=25, choices=2)) == pytest.approx(12.5)
    assert settled(TokenCounts(output=40, choices=2)) == pytest.approx(0.3 * 20.0 + 0.7 * 12.5)


def test_settling_a_shard_that_has_not_succeeded_changes_nothing(quiet):
    from controlplane.scheduling.claims import shard_settle

    runnable_batch(new_tenant("unsettled"), 2)
    shard = shard_claim_next(model=_identity(), owner="t")  # running, not committed
    charged = TenantShare.objects.values("vtime", "served_work_units").get(tenant_id=shard.batch.tenant_id)
    speed = _identity().seconds_per_work_unit

    shard_settle(shard_id=shard.id, cycle_seconds=5.0)

    assert TenantShare.objects.values("vtime", "served_work_units").get(tenant_id=shard.batch.tenant_id) == charged
    assert _identity().seconds_per_work_unit == speed


def test_settling_a_chat_shard_weighs_completion_tokens_by_the_pinned_model(quiet, settings):
    """A generation shard's measured work is prompt + completion_weight × completion tokens, with the weight of
    the catalogue entry the batch was validated against (its snapshot), not the live entry edited since."""
    from controlplane.batches import services
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    settings.SCHEDULER_HALF_LIFE_SECONDS = math.inf
    tenant = new_tenant("chat")
    line = {"model": "tinylm", "messages": [{"role": "user", "content": "count to five"}], "max_tokens": 8}
    file = upload(tenant, jsonl([{"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", "body": line}]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", priority=None
    )
    services.batch_validate(batch_id=batch.id)
    assert Batch.objects.get(id=batch.id).model_snapshot["completion_weight"] == 20.0  # the shipped entry's
    CatalogueModel.objects.filter(name="tinylm").update(completion_weight=5.0)  # edited while the batch runs
    shard = shard_claim_next(model=CatalogueModel.objects.get(name="tinylm"), owner="t")
    assert shard is not None
    summary = PartSummary("p", 1, 0, TokenCounts(input=30, output=4, choices=1), False)
    assert shard_commit(shard_id=shard.id, attempt=shard.attempt, summary=summary)

    shard_settle(shard_id=shard.id)

    assert TenantShare.objects.get(tenant_id=tenant.id).served_work_units == 30 + 20.0 * 4


def test_a_negative_or_zero_shard_time_leaves_the_speed_estimate_alone(quiet):
    """A shard's finished_at before its started_at (clocks skewed across hosts) or a zero cycle measures
    nothing: the model's seconds per work unit stays as it was."""
    from controlplane.batches.run.shards import PartSummary, shard_commit
    from controlplane.scheduling.claims import shard_settle

    runnable_batch(new_tenant("skew"), 4)  # two shards of two rows
    CatalogueModel.objects.filter(name="identity").update(seconds_per_work_unit=0.5)
    for cycle_seconds in [None, 0.0]:
        shard = shard_claim_next(model=_identity(), owner="t")
        assert shard_commit(
            shard_id=shard.id, attempt=shard.attempt, summary=PartSummary("p", 2, 0, TokenCounts(), False)
        )
        finished = Shard.objects.get(id=shard.id).finished_at
        Shard.objects.filter(id=shard.id).update(started_at=finished + timedelta(seconds=5))

        shard_settle(shard_id=shard.id, cycle_seconds=cycle_seconds)

        assert _identity().seconds_per_work_unit == 0.5

"""shard_settle (scheduling/claims.py) after a shard commits: the tenant's charge corrected by measured work, the
model's two speed estimates (the slot's cycle, and its Triton calls' time that shards are cut by) and its expected
completion. Split from test_claims.py, which keeps the claim itself."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, Shard
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from controlplane.scheduling.models import TenantShare
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.scheduling import new_tenant, runnable_batch


@pytest.fixture
def quiet(settings, monkeypatch, catalogue):
    # The tests drive claims themselves; nothing goes to the broker.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    settings.SCHEDULER_AGING_SECONDS = 3600.0


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def test_the_speed_estimate_counts_what_a_shard_cost_its_slot(quiet):
    """shard_settle folds the slot's whole cycle (claim and commit included) into seconds per work unit when
    the runner measured it, else the shard's own started → finished."""
    from controlplane.batches.shards import PartSummary, shard_commit
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
    from controlplane.batches.shards import PartSummary, shard_commit
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
    from controlplane.batches.shards import PartSummary, shard_commit
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
    from controlplane.batches.shards import PartSummary, shard_commit
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
    from controlplane.batches.shards import PartSummary, shard_commit
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
    from controlplane.batches.shards import PartSummary, shard_commit
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
    from controlplane.batches.shards import PartSummary, shard_commit
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

"""Shards that run while their file is still validated (batches/intake/early_dispatch.py): the work is kept and
charged as usual when the whole file proves valid; an invalid file, a cancel or a newer attempt discards it, and
the first two (the tenant's doing) still charge the shards that finished, as discarded ledger rows.

A "worker" here is the test itself: each time validation adds shards to the database, the hook runs some
of them to completion with a fake backend before validation reads on."""

from __future__ import annotations

import json

import pytest

from controlplane.batches import services
from controlplane.batches.intake import early_dispatch
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.batches.pinning import pinned_model
from controlplane.batches.render import batch_render
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.batches.run.execution import shard_execute
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_open, blob_storage
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.claims import shard_claim_next
from controlplane.tenants.models import Tenant
from controlplane.usage.models import UsageRecord
from tests.support.batches import jsonl, tensor_line, upload, validated_batch
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch, run_shard

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    monkeypatch.setattr(early_dispatch, "FLUSH_SECONDS", 0.0)  # every planned shard reaches the database at once
    settings.SHARD_MAX_LINES = 4
    settings.BATCH_EARLY_DISPATCH = True


def _create(tenant, lines) -> Batch:
    file = upload(tenant, jsonl(lines))
    return services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")


def _run(shard: Shard, backend: FakeBackend) -> str:
    """Run the shard the scheduler serves next, which must be ``shard``."""
    return run_shard(shard, backend, owner="early-worker")


@pytest.fixture
def on_flush(monkeypatch):
    """``on_flush(hook)`` calls ``hook(batch_id, flush_number)`` after each flush of planned shards, as a worker
    would see them; returns the flush count. The hook runs inside validation, whose ``except Exception`` would
    turn a failed assert into a failed batch and let the test go on: every failure is kept and fails the test."""
    failures: list[BaseException] = []

    def install(hook):
        original = early_dispatch.EarlyShards.flush
        count = {"n": 0}

        def flush(self):
            had = bool(self._pending)
            original(self)
            if had:
                count["n"] += 1
                try:
                    hook(self.batch_id, count["n"])
                except BaseException as exc:
                    failures.append(exc)
                    raise

        monkeypatch.setattr(early_dispatch.EarlyShards, "flush", flush)
        return count

    yield install
    assert not failures, f"a flush hook failed inside validation: {failures!r}"


def _lines(n: int) -> list[dict]:
    return [tensor_line(f"r-{i}", [[float(i), 1.0]]) for i in range(n)]


def test_shards_run_while_validating_show_and_charge_only_once_the_file_is_valid(tenant, eager, monkeypatch, on_flush):
    backend = FakeBackend()
    seen_while_validating = []

    def worker(batch_id, flush):
        batch = Batch.objects.get(id=batch_id)
        if flush <= 2:  # both shards added early finish before validation does
            for shard in Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING).order_by("index"):
                assert _run(shard, backend) == "succeeded"
        batch.refresh_from_db()
        assert batch.status == BatchStatus.VALIDATING and batch.completed_lines > 0
        seen_while_validating.append(batch_render(batch))
        assert not UsageRecord.objects.filter(batch_id=batch_id).exists()  # not charged yet

    flushes = on_flush(worker)
    batch = _create(tenant, _lines(10))
    services.batch_validate(batch_id=batch.id)

    assert flushes["n"] == 2  # the last shard is not added early: the verdict follows at once
    for rendered in seen_while_validating:
        assert rendered["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
        assert rendered["usage"]["total_tokens"] == 0 and rendered["model"] is None
        assert rendered["cost"]["value"] == 0
    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS and batch.total_lines == 10
    # The two shards that committed while it validated got their ledger rows with the transition.
    assert UsageRecord.objects.filter(batch_id=batch.id).count() == 2
    event = BatchEvent.objects.get(batch=batch, kind="in_progress")
    assert "2 added while validating, 2 of them done" in event.message

    last = Shard.objects.get(batch=batch, status=ShardStatus.PENDING)
    assert _run(last, backend) == "succeeded"  # its commit writes its own row, and finalizes the batch
    assert sorted(UsageRecord.objects.filter(batch_id=batch.id).values_list("shard_id", flat=True)) == sorted(
        Shard.objects.filter(batch=batch).values_list("id", flat=True)
    )
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    assert batch_render(batch)["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
    with blob_open(File.objects.get(id=batch.output_file_id).storage_name) as fh:
        out = [json.loads(line) for line in fh]
    assert [r["custom_id"] for r in out] == [f"r-{i}" for i in range(10)]


def test_all_shards_done_while_validating_still_finalize(tenant, eager, monkeypatch, on_flush):
    """8 lines in shards of 4: both close inside the pass, so both run early and may be done before the
    verdict."""
    backend = FakeBackend()

    def worker(batch_id, flush):
        run_batch(Batch.objects.get(id=batch_id), backend, owner="early-worker")

    on_flush(worker)
    finalize_sent = []
    monkeypatch.setattr(dispatch, "batch_finalize_enqueue", finalize_sent.append)
    batch = _create(tenant, _lines(8))
    services.batch_validate(batch_id=batch.id)
    # No shard is left to finalize the batch when it commits: validation's end asks for it.
    assert finalize_sent == [batch.id]
    assert batch_try_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == 8
    assert UsageRecord.objects.filter(batch_id=batch.id).count() == 2


def test_a_file_found_invalid_late_discards_the_work_already_done(tenant, eager, monkeypatch, on_flush):
    """The duplicate id on line 9 is only known after the whole pass; by then two shards have run."""
    backend = FakeBackend()
    parts = []

    def worker(batch_id, flush):
        for shard in Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING).order_by("index"):
            assert _run(shard, backend) == "succeeded"
            parts.append(Shard.objects.get(id=shard.id).part_name)

    on_flush(worker)
    lines = _lines(10)
    lines[8] = tensor_line("r-0", [[8.0, 1.0]])
    batch = _create(tenant, lines)
    services.batch_validate(batch_id=batch.id)

    batch.refresh_from_db()
    assert batch.status == BatchStatus.FAILED
    assert [e["code"] for e in batch.errors["data"]] == ["duplicate_custom_id"]
    assert len(parts) >= 2
    assert not Shard.objects.filter(batch=batch).exists()
    assert (batch.completed_lines, batch.failed_lines) == (0, 0)
    assert batch.output_file_id is None and batch.error_file_id is None
    # The work done was GPU time: charged, one ledger row per shard that finished, marked discarded.
    charged = UsageRecord.objects.filter(batch_id=batch.id)
    assert charged.count() == len(parts) and all(r.discarded for r in charged)
    assert sum(r.completed_lines for r in charged) == sum(r.rows for r in charged) > 0
    assert not any(blob_storage().exists(name) for name in parts)


def test_cancel_while_validating_discards_shards_and_a_running_one_publishes_nothing(
    tenant, eager, monkeypatch, on_flush
):
    backend = FakeBackend()
    state = {}

    def worker(batch_id, flush):
        if flush == 1:
            first = Shard.objects.get(batch_id=batch_id, index=0)
            claimed = shard_claim_next(model=CatalogueModel.objects.get(name="identity"), owner="slow-worker")
            assert claimed is not None and claimed.id == first.id
            state["claimed"] = claimed  # running, not finished
            services.batch_cancel(batch=Batch.objects.get(id=batch_id))

    on_flush(worker)
    batch = _create(tenant, _lines(10))
    services.batch_validate(batch_id=batch.id)  # its next flush finds the batch gone from validating

    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED
    assert not Shard.objects.filter(batch=batch).exists()
    claimed = state["claimed"]
    outcome = shard_execute(shard=claimed, model=pinned_model(claimed.batch.model_snapshot), backend=backend)
    assert outcome in ("stale", "lease_lost")
    batch.refresh_from_db()
    assert (batch.completed_lines, batch.output_file_id) == (0, None)
    assert not UsageRecord.objects.filter(batch_id=batch.id).exists()


def test_cancel_while_validating_charges_the_finished_shards_toward_the_spend_cap(tenant, eager, monkeypatch, on_flush):
    """A tenant cannot run GPU work for free by cancelling (or spoiling) a batch after its first
    shards ran early. The finished shard's ledger row is written, marked discarded, and the spend cap counts it."""
    from decimal import Decimal

    from controlplane.core.http.errors import QuotaExceeded
    from controlplane.usage.models import Price

    Price.objects.create(model=CatalogueModel.objects.get(name="identity"), per_thousand_rows=Decimal("1000"))
    backend = FakeBackend()

    def worker(batch_id, flush):
        if flush == 1:
            (shard,) = Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING)
            assert _run(shard, backend) == "succeeded"
            services.batch_cancel(batch=Batch.objects.get(id=batch_id))

    on_flush(worker)
    batch = _create(tenant, _lines(10))
    services.batch_validate(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED and not Shard.objects.filter(batch=batch).exists()
    (charged,) = UsageRecord.objects.filter(batch_id=batch.id)
    assert charged.discarded and charged.completed_lines == charged.rows == 4
    assert charged.cost == Decimal(4)  # 4 rows at 1000 per thousand
    tenant.monthly_spend_cap = Decimal(4)
    tenant.save()
    with pytest.raises(QuotaExceeded) as refused:
        _create(tenant, _lines(2))
    assert refused.value.code == "spend_cap_exceeded"


def test_a_batch_that_expires_while_validating_answers_every_line(tenant, eager, monkeypatch, on_flush):
    """OpenAI's expiry: finished lines in the output, every other line batch_expired. The expiry comes after the
    first early shard finished: validation goes on, the second early shard never runs, and the batch
    finalizes as soon as the file is valid."""
    from django.utils import timezone

    from controlplane.batches.models import StopReason

    backend = FakeBackend()

    def worker(batch_id, flush):
        if flush == 1:
            (shard,) = Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING)
            assert _run(shard, backend) == "succeeded"
            Batch.objects.filter(id=batch_id).update(expires_at=timezone.now())
            assert services.batches_expire() == [batch_id]
            batch = Batch.objects.get(id=batch_id)
            assert (batch.status, batch.stop_reason) == (BatchStatus.VALIDATING, StopReason.EXPIRE)

    on_flush(worker)
    finalize_sent = []
    monkeypatch.setattr(dispatch, "batch_finalize_enqueue", finalize_sent.append)
    batch = _create(tenant, _lines(10))
    services.batch_validate(batch_id=batch.id)

    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS and batch.total_lines == 10
    assert finalize_sent == [batch.id]  # nothing else would finalize it: no shard is left to close
    assert sorted(Shard.objects.filter(batch=batch).values_list("status", flat=True)) == [
        ShardStatus.SKIPPED,
        ShardStatus.SKIPPED,
        ShardStatus.SUCCEEDED,
    ]
    assert shard_claim_next(model=CatalogueModel.objects.get(name="identity"), owner="late-worker") is None
    assert batch_try_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.EXPIRED
    assert batch_render(batch)["request_counts"] == {"total": 10, "completed": 4, "failed": 6}
    with blob_open(File.objects.get(id=batch.output_file_id).storage_name) as fh:
        assert [json.loads(line)["custom_id"] for line in fh] == [f"r-{i}" for i in range(4)]
    with blob_open(File.objects.get(id=batch.error_file_id).storage_name) as fh:
        errors = [json.loads(line) for line in fh]
    assert [e["custom_id"] for e in errors] == [f"r-{i}" for i in range(4, 10)]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    # The finished shard is charged, as any expired batch's finished lines are (not as discarded work).
    (charged,) = UsageRecord.objects.filter(batch_id=batch.id)
    assert not charged.discarded and charged.completed_lines == 4


def test_a_newer_attempt_supersedes_the_running_one(tenant, eager, monkeypatch, on_flush):
    """A rescued or redelivered validation starts while the first still runs: the first stops adding
    shards and cannot settle the batch; the newest attempt's shards are the batch's."""
    backend = FakeBackend()

    def newer_attempt_starts(batch_id, flush):
        if flush == 1:
            assert early_dispatch.validation_attempt_begin(batch_id=batch_id) == 2
            assert not Shard.objects.filter(batch_id=batch_id).exists()  # the first attempt's shard went

    counter = on_flush(newer_attempt_starts)
    batch = _create(tenant, _lines(10))
    services.batch_validate(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.VALIDATING and counter["n"] == 1
    assert not Shard.objects.filter(batch=batch).exists()

    assert not UsageRecord.objects.filter(batch_id=batch.id).exists()  # a rescue is the service's doing: free
    services.batch_validate(batch_id=batch.id)  # attempt 3 runs to the end
    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS and batch.validation_attempt == 3
    assert list(Shard.objects.filter(batch=batch).order_by("index").values_list("index", flat=True)) == [0, 1, 2]
    assert run_batch(batch, backend, owner="early-worker") == ["succeeded"] * 3
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == 10


def test_switched_off_no_shard_exists_before_the_file_is_valid(tenant, eager, settings, monkeypatch, on_flush):
    settings.BATCH_EARLY_DISPATCH = False
    flushes = on_flush(lambda batch_id, flush: None)
    batch = _create(tenant, _lines(10))
    services.batch_validate(batch_id=batch.id)
    assert flushes["n"] == 0
    assert Shard.objects.filter(batch=batch).count() == 3


def test_early_shards_yield_to_a_valid_batch_of_their_model(tenant, other_tenant, eager, on_flush):
    """Shards of a file that may still prove invalid take only capacity no valid batch wants: while a valid batch of
    the model has shards pending or running, the scheduler serves none of the validating batch's."""
    backend = FakeBackend()
    model = CatalogueModel.objects.get(name="identity")
    valid = validated_batch(other_tenant, _lines(8), endpoint="/v2/infer")
    assert valid.status == BatchStatus.IN_PROGRESS
    served = []

    def worker(batch_id, flush):
        if flush != 1:
            return
        assert Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING).exists()
        while (shard := shard_claim_next(model=model, owner="early-worker")) is not None:
            served.append(shard.batch_id)
            assert shard_execute(shard=shard, model=model, backend=backend) == "succeeded"
            if shard.batch_id == valid.id:
                batch_try_finalize(batch_id=valid.id)

    on_flush(worker)
    batch = _create(tenant, _lines(12))
    services.batch_validate(batch_id=batch.id)

    # The valid batch's two shards first, then the early shard that was waiting (the second is added later).
    assert served == [valid.id, valid.id, batch.id]
    valid.refresh_from_db()
    assert valid.status == BatchStatus.COMPLETED


def test_early_shards_do_not_wait_for_work_that_cannot_run(tenant, other_tenant, eager, on_flush):
    """A valid batch whose shards nobody may claim (its tenant paused) holds no capacity: the early shards run."""
    model = CatalogueModel.objects.get(name="identity")
    valid = validated_batch(other_tenant, _lines(8), endpoint="/v2/infer")
    assert valid.status == BatchStatus.IN_PROGRESS
    Tenant.objects.filter(id=other_tenant.id).update(paused=True)
    served = []

    def worker(batch_id, flush):
        if flush == 1:
            served.append(shard_claim_next(model=model, owner="early-worker"))

    on_flush(worker)
    batch = _create(tenant, _lines(12))
    services.batch_validate(batch_id=batch.id)
    assert served[0] is not None and served[0].batch_id == batch.id


def test_early_shards_run_at_most_the_cap_at_once(tenant, eager, settings, on_flush):
    """BATCH_EARLY_DISPATCH_MAX_RUNNING bounds a validating batch's shards in flight; once the file is valid the
    bound is gone."""
    settings.BATCH_EARLY_DISPATCH_MAX_RUNNING = 1
    model = CatalogueModel.objects.get(name="identity")
    claims = {}

    def worker(batch_id, flush):
        if flush == 2:  # two early shards pending: one is claimed (and left running), the other must wait
            claims["first"] = shard_claim_next(model=model, owner="early-worker")
            claims["while_one_runs"] = shard_claim_next(model=model, owner="early-worker")
            settings.BATCH_EARLY_DISPATCH_MAX_RUNNING = 2
            claims["with_room"] = shard_claim_next(model=model, owner="early-worker")

    on_flush(worker)
    batch = _create(tenant, _lines(12))
    services.batch_validate(batch_id=batch.id)

    assert claims["first"] is not None and claims["first"].batch_id == batch.id
    assert claims["while_one_runs"] is None
    assert claims["with_room"] is not None and claims["with_room"].id != claims["first"].id
    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS
    settings.BATCH_EARLY_DISPATCH_MAX_RUNNING = 1  # a valid batch's shards are not bound by it: two still run
    last = shard_claim_next(model=model, owner="early-worker")
    assert last is not None and last.batch_id == batch.id
    assert Shard.objects.filter(batch=batch, status=ShardStatus.RUNNING).count() == 3

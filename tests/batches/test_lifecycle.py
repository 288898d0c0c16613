"""Batch lifecycle through the services with a fake backend: validate → shards → run → finalize."""

from __future__ import annotations

import json

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from controlplane.kinds.base import TokenCounts
from tests.support.batches import embedding_line, file_records, jsonl, tensor_line, upload
from tests.support.fakes import FakeBackend, fake_embedding
from tests.support.running import run_batch, run_next, run_shard

pytestmark = pytest.mark.django_db(transaction=True)


def _create(tenant, lines, endpoint="/v1/embeddings", **kw) -> Batch:
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint=endpoint, completion_window="24h", **kw
    )
    return batch


def _run_all(batch: Batch, backend: FakeBackend) -> Batch:
    run_batch(batch, backend)
    return Batch.objects.get(id=batch.id)


@pytest.fixture
def eager(settings, monkeypatch):
    # Tasks enqueued on commit would run in-process; these tests drive the services themselves.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4


def test_embeddings_batch_completes_in_input_order(tenant, eager):
    texts = [f"sentence number {i} " + "word " * (i % 5) for i in range(10)]
    lines = [embedding_line(f"req-{i}", t) for i, t in enumerate(texts)]
    lines[3] = embedding_line("req-3", [texts[3], "second input"])
    batch = _create(tenant, lines, metadata={"team": "search"})
    services.batch_validate(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.IN_PROGRESS
    assert batch.total_lines == 10
    assert list(Shard.objects.filter(batch=batch).order_by("index").values_list("request_count", flat=True)) == [
        4,
        4,
        2,
    ]

    backend = FakeBackend()
    batch = _run_all(batch, backend)

    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (10, 0)
    output = file_records(batch.output_file_id)
    assert [r["custom_id"] for r in output] == [f"req-{i}" for i in range(10)]
    first = output[0]["response"]
    assert first["status_code"] == 200
    assert first["body"]["object"] == "list"
    assert first["body"]["data"][0]["embedding"] == pytest.approx(fake_embedding(texts[0]).tolist(), abs=1e-6)
    assert [d["index"] for d in output[3]["response"]["body"]["data"]] == [0, 1]
    assert batch.error_file_id is None
    # Length-sorted packing: within each call, texts are in non-decreasing length order.
    for call in backend.calls:
        lengths = [len(row[0]) for row in call["TEXT"]]
        assert lengths == sorted(lengths)


def test_tensor_batch_stacks_rows_and_splits_results(tenant, eager):
    lines = [tensor_line(f"t{i}", [[float(i), 1.0, 2.0]] * (1 + i % 3)) for i in range(6)]
    batch = _create(tenant, lines, endpoint="/v2/infer")
    services.batch_validate(batch_id=batch.id)
    backend = FakeBackend()
    batch = _run_all(batch, backend)
    assert batch.status == BatchStatus.COMPLETED, batch.errors
    output = file_records(batch.output_file_id)
    for i, record in enumerate(output):
        out = record["response"]["body"]["outputs"][0]
        assert out["name"] == "OUTPUT0" and out["shape"] == [1 + i % 3, 3]
        assert out["data"][0] == float(i)
    # Four lines per shard, stacked into one Triton call per shard.
    assert len(backend.calls) == 2


def test_permanent_error_is_pinned_to_its_line(tenant, eager):
    lines = [embedding_line(f"r{i}", "REJECT me" if i == 2 else f"fine {i}") for i in range(4)]
    batch = _create(tenant, lines)
    services.batch_validate(batch_id=batch.id)
    batch = _run_all(batch, FakeBackend())
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (3, 1)
    errors = file_records(batch.error_file_id)
    assert [e["custom_id"] for e in errors] == ["r2"]
    assert errors[0]["response"]["status_code"] == 400
    assert "rejected" in errors[0]["response"]["body"]["error"]["message"]


def test_stale_attempt_cannot_commit(tenant, eager):
    from controlplane.batches.shards import PartSummary, shard_commit, shards_rescue
    from controlplane.fleet.models import CatalogueModel
    from controlplane.scheduling.claims import shard_claim_next

    batch = _create(tenant, [embedding_line("a", "x")])
    services.batch_validate(batch_id=batch.id)
    shard = Shard.objects.get(batch=batch)
    model = CatalogueModel.objects.get(name="all-MiniLM-L6-v2")
    first = shard_claim_next(model=model, owner="w1")
    assert first is not None and (first.id, first.attempt) == (shard.id, 1)
    assert shard_claim_next(model=model, owner="w2") is None  # held
    # Worker 1 is presumed dead: its lease expires and the rescuer hands the shard out again.
    Shard.objects.filter(id=shard.id).update(lease_expires_at="2000-01-01T00:00:00Z")
    shards_rescue()
    second = shard_claim_next(model=model, owner="w2")
    assert second is not None and (second.id, second.attempt) == (shard.id, 2)
    summary = PartSummary(part_name="parts/x", completed=1, failed=0, tokens=TokenCounts(input=1), stopped=False)
    assert shard_commit(shard_id=shard.id, attempt=1, summary=summary) is False
    assert shard_commit(shard_id=shard.id, attempt=2, summary=summary) is True
    assert shard_commit(shard_id=shard.id, attempt=2, summary=summary) is False  # exactly once
    assert Batch.objects.get(id=batch.id).completed_lines == 1


def test_cancel_keeps_finished_lines_and_accounts_for_the_rest(tenant, eager):
    lines = [embedding_line(f"r{i}", f"text {i}") for i in range(12)]
    batch = _create(tenant, lines)
    services.batch_validate(batch_id=batch.id)
    assert run_shard(Shard.objects.get(batch=batch, index=0), FakeBackend()) == "succeeded"
    assert batch_try_finalize(batch_id=batch.id) is False  # two shards are still pending
    services.batch_cancel(batch=Batch.objects.get(id=batch.id))
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLING
    assert batch_try_finalize(batch_id=batch.id) is True
    assert batch_try_finalize(batch_id=batch.id) is False  # finalized already: a late message does nothing
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED and batch.cancelled_at is not None
    output, errors = file_records(batch.output_file_id), file_records(batch.error_file_id)
    assert [r["custom_id"] for r in output] == [f"r{i}" for i in range(4)]
    assert [r["custom_id"] for r in errors] == [f"r{i}" for i in range(4, 12)]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert set(Shard.objects.filter(batch=batch).values_list("status", flat=True)) == {
        ShardStatus.SUCCEEDED,
        ShardStatus.SKIPPED,
    }


def test_a_cancelled_batch_writing_its_files_shows_cancelling_not_finalizing(tenant, eager):
    """OpenAI's path is in_progress → cancelling → cancelled: the finalizing step stays internal."""
    from controlplane.batches.render import batch_render

    batch = _create(tenant, [embedding_line(f"r{i}", f"text {i}") for i in range(4)])
    services.batch_validate(batch_id=batch.id)
    services.batch_cancel(batch=Batch.objects.get(id=batch.id))
    Batch.objects.filter(id=batch.id).update(status=BatchStatus.FINALIZING)  # as batch_try_finalize leaves it
    assert batch_render(Batch.objects.get(id=batch.id))["status"] == "cancelling"
    Batch.objects.filter(id=batch.id).update(stop_reason=None)
    assert batch_render(Batch.objects.get(id=batch.id))["status"] == "finalizing"


def test_expiry_marks_unfinished_lines_batch_expired(tenant, eager):
    from datetime import timedelta

    from django.utils import timezone

    lines = [embedding_line(f"r{i}", f"text {i}") for i in range(8)]
    batch = _create(tenant, lines)
    services.batch_validate(batch_id=batch.id)
    # Shard 0 waits out a backoff (as after a transient failure), so the slot serves shard 1 first: the
    # finished lines are then the later ones, and the expired ones come before them in the input.
    Shard.objects.filter(batch=batch, index=0).update(not_before=timezone.now() + timedelta(hours=1))
    assert run_shard(Shard.objects.get(batch=batch, index=1), FakeBackend()) == "succeeded"
    Batch.objects.filter(id=batch.id).update(expires_at=timezone.now())
    assert services.batches_expire() == [batch.id]
    batch_try_finalize(batch_id=batch.id)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.EXPIRED
    assert [r["custom_id"] for r in file_records(batch.output_file_id)] == [f"r{i}" for i in range(4, 8)]
    errors = file_records(batch.error_file_id)
    assert [r["custom_id"] for r in errors] == [f"r{i}" for i in range(4)]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_transient_failures_release_the_shard_without_spending_attempts(tenant, eager, settings, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.batches import shards

    # A backoff no busy machine outlasts between the release and the next claim below.
    monkeypatch.setattr(shards, "RELEASE_BACKOFF_SECONDS", 60.0)
    monkeypatch.setattr(shards, "RELEASE_BACKOFF_MAX_SECONDS", 60.0)
    settings.SHARD_MAX_ATTEMPTS = 2
    batch = _create(tenant, [embedding_line("a", "x")])
    services.batch_validate(batch_id=batch.id)
    shard = Shard.objects.get(batch=batch)
    for _ in range(5):  # an outage far longer than the attempt budget
        assert run_shard(shard, FakeBackend(transient_failures=99)) == "deferred"
        shard.refresh_from_db()
        assert (shard.status, shard.content_failures) == (ShardStatus.PENDING, 0)
        # It waits in the row before it is runnable again: no slot claims it until then.
        assert shard.not_before is not None and shard.not_before > timezone.now()
        assert run_next("all-MiniLM-L6-v2", FakeBackend()) is None
        Shard.objects.filter(id=shard.id).update(not_before=timezone.now() - timedelta(seconds=1))  # time passes
    assert run_shard(shard, FakeBackend()) == "succeeded"
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (1, 0)
    assert batch.error_file_id is None


@pytest.mark.parametrize(("instances", "calls"), [(None, 3), (1, 1), (2, 2), (8, 3)])
def test_a_shard_is_split_over_the_model_instances_and_no_further(tenant, eager, settings, instances, calls):
    """DISPATCH_INFLIGHT_CALLS (3) calls at most; fewer when the backend knows of fewer instances (Triton's
    batcher does not split a call, so a finer split only makes its executions smaller)."""
    settings.SHARD_MAX_LINES = 12
    batch = _create(tenant, [embedding_line(f"r-{i}", f"text {i}") for i in range(12)])
    services.batch_validate(batch_id=batch.id)
    backend = FakeBackend()
    backend.instances = instances
    batch = _run_all(batch, backend)
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == 12
    assert len(backend.calls) == calls


@pytest.mark.parametrize(("gpus", "texts_per_call"), [(False, [10, 2]), (True, [6, 6])])
def test_texts_are_cut_by_cost_on_cpu_instances_and_by_count_on_gpus(tenant, eager, settings, gpus, texts_per_call):
    """Four long texts and eight short ones over two instances: on CPUs a call's cost is its characters, so the
    long ones are shared out (the costliest call first); on GPUs a pass costs its launches, so counts are even."""
    settings.SHARD_MAX_LINES = 12
    texts = ["x" * 400] * 4 + [f"s{i}" for i in range(8)]
    batch = _create(tenant, [embedding_line(f"r-{i}", text) for i, text in enumerate(texts)])
    services.batch_validate(batch_id=batch.id)
    backend = FakeBackend()
    backend.instances, backend.gpus = 2, gpus
    batch = _run_all(batch, backend)
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == 12
    assert [len(call["TEXT"]) for call in backend.calls] == texts_per_call


def test_the_fleet_backend_counts_the_ready_instances_it_routes_to(catalogue):
    from controlplane.fleet.backend import backend_for_model
    from controlplane.fleet.models import CatalogueModel, Placement, PlacementStatus, TritonServer
    from controlplane.fleet.placement import routing

    routing._cache.clear()
    model = CatalogueModel.objects.get(name="identity")
    for host, instances in ((1, 2), (2, 1)):
        server = TritonServer.objects.create(name=f"gpu-{host}", grpc_url=f"10.0.0.{host}:8001")
        Placement.objects.create(model=model, server=server, instances=instances, status=PlacementStatus.READY)
    loading = TritonServer.objects.create(name="c", grpc_url="10.0.0.9:8001")
    Placement.objects.create(model=model, server=loading, instances=4, status=PlacementStatus.LOADING)
    assert backend_for_model("identity").instances == 3  # the loading placement gets no calls yet
    assert backend_for_model("identity").gpus is False  # declared GPUs: KIND_CPU instances
    TritonServer.objects.filter(name="gpu-2").update(real_gpus=True)
    routing._cache.clear()
    assert backend_for_model("identity").gpus is True
    routing._cache.clear()

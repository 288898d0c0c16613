"""The routing table: validation on its own queue, beat's jobs on housekeeping, finalize on control, and every queue
has a worker in the local runner, compose and Kubernetes (tests/deploy checks the manifests)."""

from __future__ import annotations

from django.conf import settings

from controlplane.celery import app
from controlplane.core.messaging import dispatch
from controlplane.core.messaging.queues import QUEUES, queue_for
from deploy.local.stack import Stack


def test_each_task_goes_to_its_queue():
    assert queue_for(dispatch.VALIDATE) == "validation"
    assert queue_for(dispatch.FINALIZE) == "control"
    assert queue_for(dispatch.SLOT) == "shards"
    assert queue_for(dispatch.WEBHOOK_DELIVER) == "webhooks"
    # Asked for by services too, but beat's jobs: never behind a tenant's validation or finalize.
    assert queue_for(dispatch.TOPUP) == queue_for(dispatch.FLEET_RECONCILE) == "housekeeping"


def test_every_beat_job_is_housekeeping_and_nothing_else_is():
    beat_tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {task: queue_for(task) for task in beat_tasks} == dict.fromkeys(beat_tasks, "housekeeping")
    app.loader.import_default_modules()
    ours = {name for name in app.tasks if not name.startswith("celery.")}
    assert beat_tasks <= ours
    assert {name for name in ours if queue_for(name) == "housekeeping"} == beat_tasks
    assert {queue_for(name) for name in ours} == set(QUEUES)


def test_beat_sends_where_dispatch_sends():
    for task, route in settings.CELERY_TASK_ROUTES.items():
        assert route == {"queue": queue_for(task)}
    assert settings.CELERY_TASK_DEFAULT_QUEUE == queue_for("any.other") == "control"


def test_the_local_runner_starts_one_worker_per_queue(tmp_path, monkeypatch):
    spawned: dict[str, list[str]] = {}
    stack = Stack(var_dir=tmp_path, with_triton=False, with_beat=False)
    monkeypatch.setattr(stack, "manage", lambda *args, **kwargs: None)
    monkeypatch.setattr(stack, "_wait_http", lambda *args, **kwargs: None)
    monkeypatch.setattr(stack, "_spawn", lambda name, cmd: spawned.setdefault(name, cmd))
    stack._start()
    workers = {name: cmd for name, cmd in spawned.items() if "worker" in cmd}
    queues = {cmd[cmd.index("-Q") + 1]: cmd[cmd.index("-P") + 1] for cmd in workers.values()}
    assert set(queues) == set(QUEUES)
    # Validation parses on processes: one tenant's file never holds the GIL of another queue's work.
    assert queues["validation"] == "prefork"
    assert queues["housekeeping"] == queues["control"] == "threads"

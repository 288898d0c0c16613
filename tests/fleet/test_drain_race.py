"""A drain's delete of its server row beside a concurrent writer of that server's placement events (the heartbeat
marking it unhealthy, the reconciler): the event that commits while the drain deletes must not fail the drain.

Django's delete sets the server's events' server to NULL, then deletes its GPUs, then the row; an event committed
in that window referenced a row the commit then deleted (a 500 from the drain endpoint, a lost server left
registered: seen in tests/e2e/test_autoscale.py). The window is entered from the GPUs' post_delete signal."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import post_delete

from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.membership.join_leave import server_drain
from controlplane.fleet.models import Gpu, PlacementEvent, TritonServer

pytestmark = pytest.mark.django_db(transaction=True)
GIB = 1024**3


def test_an_event_written_while_the_server_is_deleted_does_not_fail_the_drain(monkeypatch):
    from controlplane.core.messaging import dispatch

    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    server_register(name="racy", grpc_url="127.0.0.1:1", gpu_memory_bytes=[GIB])
    server_id = TritonServer.objects.get(name="racy").id
    outcome: dict[str, object] = {}

    def write_event() -> None:
        try:
            with transaction.atomic():
                PlacementEvent.objects.create(server_id=server_id, action="server_unhealthy", actor="heartbeat")
            outcome["event"] = "committed"
        except IntegrityError:
            outcome["event"] = "refused"  # the server row was gone by its commit: the writer's loss, not the drain's
        finally:
            connection.close()

    writers: list[threading.Thread] = []

    def in_the_window(sender, **kwargs) -> None:
        if writers:
            return
        writer = threading.Thread(target=write_event)
        writers.append(writer)
        writer.start()
        writer.join(timeout=1.0)  # without the drain's row lock it commits here, inside the window

    post_delete.connect(in_the_window, sender=Gpu, weak=False)
    try:
        status = server_drain(name="racy", actor="test")
    finally:
        post_delete.disconnect(in_the_window, sender=Gpu)
    writers[0].join(timeout=10)
    assert status.drained
    assert not TritonServer.objects.filter(name="racy").exists()
    assert outcome["event"] == "refused"
    assert PlacementEvent.objects.filter(action="server_leave", reason__contains="racy drained").exists()

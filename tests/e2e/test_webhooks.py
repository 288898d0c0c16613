"""Webhooks through the running stack: the webhooks worker delivers batch.completed to a real receiver on
this machine, the openai SDK verifies it, and a failed first attempt is retried by beat's sweep with the same
webhook-id (the local runner allows loopback endpoints; production refuses them)."""

from __future__ import annotations

import httpx2
import pytest

from tests.support.stack import embedding_lines, submit
from tests.support.webhook_receiver import Receiver
from tests.webhooks.conftest import unwrap

pytestmark = pytest.mark.e2e


def test_batch_completed_is_delivered_signed_and_retried(e2e):
    key = e2e.new_tenant("webhooks-e2e")
    client = e2e.sdk(key)
    receiver = Receiver(fail_first=1)
    try:
        endpoint = client.webhooks.create(url=receiver.url, name="e2e", event_types=["batch.completed"])
        batch = submit(client, embedding_lines(5, seed=7))
        batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
        assert batch.status == "completed", batch.errors
        # The first attempt gets a 500; the next, 5 s later, is sent by beat's sweep to the webhooks worker.
        first, second = receiver.wait_for(2, timeout=60)
        assert first.headers["webhook-id"] == second.headers["webhook-id"]
        event = unwrap(second, endpoint.signing_secret)
        assert (event.type, event.data.id) == ("batch.completed", batch.id)
        assert event.created_at == batch.completed_at
        log = httpx2.get(
            f"{e2e.base_url}/webhook_endpoints/{endpoint.id}/deliveries", headers={"Authorization": f"Bearer {key}"}
        )
        [delivery] = log.json()["data"]
        assert (delivery["id"], delivery["status"], delivery["attempts"]) == (
            first.headers["webhook-id"],
            "succeeded",
            2,
        )
    finally:
        receiver.close()

"""The broker is down while a tenant creates a batch.

`POST /v1/batches` must answer (not 500) with the batch in `validating`: its validation message is kept
in the transactional outbox (controlplane/core/messaging/dispatch.py) and sent by the relay once the broker is back,
so the batch then runs to the end like any other. Recovery counts from the broker answering again, to the
first shard of the batch committed."""

from __future__ import annotations

import time

import openai
import pytest

from tests.chaos.harness import PROFILE, RESUME_TARGET_S, Figures
from tests.support.stack import as_file

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def test_broker_down_during_batch_create(chaos, recorder):
    figures = Figures(f"broker down {PROFILE.broker_down_s:g} s during POST /v1/batches", target_s=RESUME_TARGET_S)
    lines = chaos.identity_lines("bdown")
    uploaded = chaos.client.files.create(file=as_file(lines), purpose="batch")
    figures.sample_contention()
    chaos.broker.kill()
    killed_at = time.time()
    batch = None
    try:
        try:
            batch = chaos.client.batches.create(
                input_file_id=uploaded.id, endpoint="/v2/infer", completion_window="24h"
            )
            figures.details["post_status"] = 200
        except openai.APIStatusError as exc:
            figures.details["post_status"] = exc.status_code
        figures.details["post_s"] = round(time.time() - killed_at, 2)
        figures.details["outbox_rows_while_down"] = chaos.sql("SELECT count(*) FROM core_outboxmessage")[0][0]
        time.sleep(max(0.0, killed_at + PROFILE.broker_down_s - time.time()))
    finally:
        chaos.broker.start()
    ready_at = time.time()
    assert batch is not None, f"POST /v1/batches failed with the broker down: {figures.details}"
    assert batch.status == "validating"
    chaos.owners[batch.id] = "a"
    chaos.wait_for("validated", lambda: chaos.status(batch.id) != "validating", 120, poll_s=0.1)
    figures.details["validated_after_broker_ready_s"] = round(time.time() - ready_at, 2)
    measured = chaos.resumed(ready_at, [batch.id], timeout_s=120)
    figures.recovery_s = measured["resume_s"]
    figures.sample_contention()
    figures.details.update(measured)
    chaos.tally(figures, batch.id, lines)
    recorder.add(figures)
    chaos.assert_clean(figures)
    assert figures.details["post_status"] == 200
    assert figures.recovery_s <= figures.bound_s()

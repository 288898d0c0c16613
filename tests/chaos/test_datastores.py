"""Redis (the broker) and Postgres restarted in place, mid-batch.

Redis runs with `--save ""`: a restart loses every queued and unacknowledged message (slots, top-ups), as
a broker without persistence does. Postgres is stopped in `immediate` mode (a crash: every connection
dies, recovery on start) and started again on the same port and data. Recovery counts from the moment the
server answers again: `resume_s` to the first commit of a shard claimed after it, `max_gap_s` the longest
pause between commits from then until the batch ends (lost slots that stall it later show there)."""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import RESUME_TARGET_S, Figures

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def _restart_mid_batch(chaos, recorder, scenario: str, restart) -> Figures:
    figures = Figures(scenario, target_s=RESUME_TARGET_S)
    lines = chaos.identity_lines(scenario.split()[0].lower())
    batch = chaos.submit(lines)
    chaos.wait_progress(batch.id, shards=3)
    figures.sample_contention()
    started = time.time()
    restart()
    ready_at = time.time()
    measured = chaos.resumed(ready_at, [batch.id], timeout_s=120)
    # Tenants keep working through the API once the dependency is back.
    api_errors = 0
    for _ in range(5):
        try:
            chaos.client.batches.retrieve(batch.id)
        except Exception:  # noqa: BLE001 - any failure counts; the figure says how many
            api_errors += 1
    figures.recovery_s = max(measured.values())
    figures.sample_contention()
    figures.details.update(measured, restart_s=round(ready_at - started, 2), api_errors_after=api_errors)
    chaos.tally(figures, batch.id, lines)
    recorder.add(figures)
    chaos.assert_clean(figures)
    assert api_errors == 0
    assert figures.recovery_s <= figures.bound_s()
    return figures


def test_redis_restarted_mid_batch(chaos, recorder):
    _restart_mid_batch(chaos, recorder, "Redis restarted mid-batch", chaos.broker.restart)


def test_postgres_restarted_mid_batch(chaos, recorder):
    _restart_mid_batch(chaos, recorder, "Postgres restarted mid-batch", lambda: chaos.pg.restart("immediate"))

"""The shard worker SIGKILLed at random moments, each time while a shard of it is running.

A kill counts only if it leaves an orphan (a shard still `running` under the dead worker's lease), so
the rescue path runs on every counted kill rather than by luck: the orphan's lease expires, the rescuer
records `shard_rescued_pending` for exactly that attempt, and a later attempt claims the shard again. The
worker is started again at once, as an orchestrator would, and the next kill comes at a random moment
after it runs a shard of its own, so rescues overlap later kills. Recovery = kill → the orphan's next
claim (target 15 s)."""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.chaos.harness import MARGIN, PROFILE, WORKER_RESCUE_TARGET_S, Figures

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

BATCH_LINES = 1000  # batches are fed as needed: every kill needs one with work left


def test_worker_sigkill_at_random_moments(chaos, recorder):
    seed = int(os.environ.get("CHAOS_SEED", "8"))
    rng = random.Random(seed)
    figures = Figures(f"worker SIGKILL x{PROFILE.worker_kills}", target_s=WORKER_RESCUE_TARGET_S)
    batches: list[tuple[str, list[dict]]] = []
    orphans: dict[tuple[int, int], float] = {}  # (shard id, attempt) -> when its worker was killed

    def feed() -> None:
        if batches:
            last = batches[-1][0]
            pending = chaos.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s AND status='pending'", last)
            if pending[0][0] >= 4 or chaos.status(last) == "validating":
                return
        lines = chaos.identity_lines(f"kill{len(batches)}", BATCH_LINES)
        batches.append((chaos.submit(lines).id, lines))

    def running_here() -> list[tuple[int, int]]:
        rows = chaos.sql("SELECT id, attempt FROM batches_shard WHERE status='running'")
        return [r for r in rows if r not in orphans]  # an orphan stays `running` until its lease runs out

    kills = missed = 0
    figures.sample_contention()
    while kills < PROFILE.worker_kills:
        feed()
        chaos.wait_for("a shard running on the live worker", running_here, 60, poll_s=0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        chaos.stack.kill("worker")
        killed_at = time.time()
        # The only shard worker is dead and its successor not started yet: what still runs is orphaned.
        new = running_here()
        chaos.stack.start_worker()
        if not new:
            missed += 1  # every running shard committed between the look and the kill; try again
            assert missed <= 5 * PROFILE.worker_kills, "could not land a kill while a shard ran"
            continue
        orphans.update(dict.fromkeys(new, killed_at))
        kills += 1
        time.sleep(rng.uniform(0.0, 2.0))

    rescues = [_rescued(chaos, shard_id, attempt, killed_at) for (shard_id, attempt), killed_at in orphans.items()]
    chaos.wait_terminal([b for b, _ in batches])
    for batch_id, lines in batches:
        chaos.tally(figures, batch_id, lines)
    figures.recovery_s = max(rescues)
    figures.sample_contention()
    figures.details.update(kills=kills, missed_kills=missed, orphans=len(orphans), rescue_s=sorted(rescues), seed=seed)
    recorder.add(figures)
    chaos.assert_clean(figures)
    assert figures.recovery_s <= figures.bound_s()


def _rescued(chaos, shard_id: int, attempt: int, killed_at: float) -> float:
    """Seconds from the kill to the orphan's next claim, after checking that its own lease expiry (not a
    release or a commit) handed it back."""

    def next_claim():
        return chaos.sql(
            "SELECT extract(epoch FROM e.created_at)::float8 FROM batches_batchevent e "
            "JOIN batches_shard s ON s.batch_id=e.batch_id AND s.index=e.shard_index "
            "WHERE s.id=%s AND e.kind='shard_claimed' AND e.message LIKE %s",
            shard_id,
            f"attempt {attempt + 1} by %",
        )

    (claimed_at,) = chaos.wait_for(
        f"shard {shard_id} claimed again after attempt {attempt}", next_claim, WORKER_RESCUE_TARGET_S * MARGIN * 2
    )[0]
    rescued = chaos.sql(
        "SELECT count(*) FROM batches_batchevent e JOIN batches_shard s ON s.batch_id=e.batch_id "
        "AND s.index=e.shard_index WHERE s.id=%s AND e.kind='shard_rescued_pending' AND e.message LIKE %s",
        shard_id,
        f"lease of attempt {attempt} expired%",
    )[0][0]
    assert rescued == 1, f"shard {shard_id}: attempt {attempt} did not come back through its expired lease"
    return round(claimed_at - killed_at, 2)

"""Generation batches (tinylm chat completions) under the faults of test_triton.py and test_worker_kill.py,
each hitting while a shard's sequences are decoding on the engine's stream.

- Triton SIGKILLed mid-stream, restarted empty after a short outage: the stream breaks, the shard is given
  back for free (kinds/generation/run.py) and regenerated whole once the reconciler has loaded tinylm again.
- Triton paused (SIGSTOP) mid-stream: the sequences in flight wait (TRITON_TIMEOUT_SECONDS is far above
  the pause) and finish after SIGCONT.
- The shard worker SIGKILLed mid-stream: Triton sees the stream's client go and cancels its sequences; the
  orphan's lease expires and a later attempt regenerates it.

The invariant of every scenario (harness.tally) plus generation's own (generation.check_generation): valid
chat.completion bodies, and the batch's usage and the ledger equal to the sum over the output lines, so a
regenerated line is billed once. Recovery as in the identity scenarios."""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos.generation import (
    CHAT,
    chat_lines,
    check_generation,
    first_claim_after,
    pending_shards,
    releases,
    shards_running,
)
from tests.chaos.harness import (
    FULL,
    GEN_MODEL,
    RESUME_TARGET_S,
    WORKER_RESCUE_TARGET_S,
    Figures,
)

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

# Short: the reconciler's reload (a heartbeat of up to 5 s, then tinylm's load) dominates the recovery
# anyway, and `make test` pays for every second here; the full profile holds it as long as a real restart.
TRITON_DOWN_S = 30.0 if FULL else 3.0
TRITON_PAUSE_S = 30.0 if FULL else 5.0
# Once a shard runs, this long before a Triton fault: its first sequences are past prefill and decoding (a
# warm shard of these lines decodes for about a second).
DECODING_S = 0.2
# The worker is killed sooner: its shard must still be running when the kill lands.
KILL_DELAY_S = 0.05
MAX_MISSED_KILLS = 5
# The stack's first generation shards run in cold worker processes (transformers and torch imported, the
# tokenizer loaded, in each prefork child): 45-85 s measured on this 2-core host at load 14-20.
FIRST_COMMIT_TIMEOUT_S = 300


def _mid_stream(chaos, batch_id: str) -> None:
    """Wait for a committed shard (the batch really runs), then for one running, mid-decode, while another
    still waits: the batch has work left after the fault (a warm batch of these lines runs in seconds)."""
    chaos.wait_progress(batch_id, shards=1, timeout_s=FIRST_COMMIT_TIMEOUT_S)

    def running_with_work_left() -> bool:
        return bool(shards_running(chaos, batch_id)) and pending_shards(chaos, batch_id) > 0

    chaos.wait_for("a generation shard running, another pending", running_with_work_left, 60, poll_s=0.02)
    time.sleep(DECODING_S)


def test_triton_killed_mid_generation(chaos, recorder):
    figures = Figures(f"generation: Triton SIGKILL, restart after {TRITON_DOWN_S:g} s", target_s=RESUME_TARGET_S)
    lines = chat_lines("gkill")
    batch = chaos.submit(lines, endpoint=CHAT, tenant="a")
    _mid_stream(chaos, batch.id)
    # Counted before the kill: the broken streams give their shards back at once.
    running_at_kill = len(shards_running(chaos, batch.id))
    figures.sample_contention()
    chaos.stack.kill("triton")
    killed_at = time.time()
    time.sleep(TRITON_DOWN_S)
    chaos.stack.restart_triton()
    triton_ready_at = time.time()
    chaos.wait_for("tinylm loaded again by the reconciler", lambda: chaos.model_ready(GEN_MODEL), 120)
    model_ready_at = time.time()
    # The cut-short shards may be claimed again while tinylm reloads (and wait for it): the resume is the first
    # commit after the model is ready, whenever its shard was claimed.
    measured = chaos.resumed(model_ready_at, [batch.id], timeout_s=120, claimed_since=False)
    figures.recovery_s = max(measured.values())
    figures.sample_contention()
    cut_short = releases(chaos, batch.id, killed_at)
    figures.details.update(
        measured,
        shards_running_at_kill=running_at_kill,
        attempts_cut_short=cut_short,
        reload_after_triton_ready_s=round(model_ready_at - triton_ready_at, 2),
        first_claim_after_model_ready_s=first_claim_after(chaos, batch.id, model_ready_at),
    )
    output, _ = chaos.tally(figures, batch.id, lines)
    check_generation(chaos, figures, batch.id, lines, output)
    recorder.add(figures)
    chaos.assert_clean(figures)
    # The kill landed on sequences in flight: their shard was given back and regenerated.
    assert cut_short >= 1, "no attempt was cut short by the kill"
    assert figures.recovery_s <= figures.bound_s()


def _resumed_or_restarted(chaos, resumed_at: float, timeout_s: float = 120) -> tuple[float, bool]:
    """Wait for the first commit after SIGCONT, or for Triton to abort on the resume (about one run in four here:
    harness.triton_restart_if_exited starts it again). Returns when the resume counts from, and whether Triton
    aborted."""
    deadline = time.monotonic() + timeout_s
    while not chaos.commits_since(resumed_at, claimed_since=False):
        if chaos.triton_restart_if_exited():
            return time.time(), True
        if time.monotonic() > deadline:
            raise AssertionError(f"no shard committed within {timeout_s:g}s of SIGCONT")
        time.sleep(0.1)
    return resumed_at, False


def test_triton_paused_mid_generation(chaos, recorder):
    figures = Figures(f"generation: Triton SIGSTOP {TRITON_PAUSE_S:g} s", target_s=RESUME_TARGET_S)
    lines = chat_lines("gpause")
    batch = chaos.submit(lines, endpoint=CHAT, tenant="b")
    _mid_stream(chaos, batch.id)
    figures.sample_contention()
    chaos.stack.signal("triton", signal.SIGSTOP)
    stopped_at = time.time()
    try:
        # Looked at once Triton is stopped: these shards' sequences are frozen mid-stream (or, claimed an
        # instant before, still connecting: those time out and are given back for free).
        frozen = shards_running(chaos, batch.id)
        time.sleep(TRITON_PAUSE_S)
    finally:
        chaos.stack.signal("triton", signal.SIGCONT)
    resumed_at = time.time()
    resumed_at, aborted = _resumed_or_restarted(chaos, resumed_at)
    # Frozen shards finish on their own attempt after SIGCONT; the warm engine may have claimed the batch's last
    # shard just before the pause, so the resume is the first commit after it, whoever claimed the shard.
    measured = chaos.resumed(resumed_at, [batch.id], timeout_s=120, claimed_since=False)
    figures.recovery_s = max(measured.values())
    figures.sample_contention()
    same_attempt = chaos.sql(
        "SELECT count(*) FROM batches_shard WHERE status='succeeded' AND (id, attempt) IN "
        "(SELECT * FROM unnest(%s::bigint[], %s::int[]))",
        [shard_id for shard_id, _ in frozen],
        [attempt for _, attempt in frozen],
    )[0][0]
    figures.details.update(
        measured,
        shards_running_at_sigstop=len(frozen),
        triton_aborted_on_resume=aborted,
        of_which_finished_on_that_attempt=same_attempt,
        attempts_cut_short=releases(chaos, batch.id, stopped_at),
    )
    output, _ = chaos.tally(figures, batch.id, lines)
    check_generation(chaos, figures, batch.id, lines, output)
    recorder.add(figures)
    chaos.assert_clean(figures)
    assert figures.recovery_s <= figures.bound_s()


def test_worker_killed_mid_generation(chaos, recorder):
    figures = Figures("generation: worker SIGKILL mid-stream", target_s=WORKER_RESCUE_TARGET_S)
    lines = chat_lines("gworker")
    batch = chaos.submit(lines, endpoint=CHAT, tenant="c")
    chaos.wait_progress(batch.id, shards=1, timeout_s=FIRST_COMMIT_TIMEOUT_S)
    orphans: list[tuple[int, int]] = []
    missed = 0
    figures.sample_contention()
    while not orphans:
        # A warm shard of generation lines decodes for about a second: kill as soon as one runs, and try
        # again (the worker restarted at once) when every running shard committed before the kill.
        chaos.wait_for("a generation shard running", lambda: shards_running(chaos, batch.id), 60, poll_s=0.02)
        time.sleep(KILL_DELAY_S)
        committed_before = chaos.succeeded_shards(batch.id)
        chaos.stack.kill("worker")
        killed_at = time.time()
        # The only shard worker is dead: what still runs is orphaned, mid-stream.
        orphans = shards_running(chaos, batch.id)
        chaos.stack.start_worker()
        missed += not orphans
        assert missed <= MAX_MISSED_KILLS, "could not land a kill while a generation shard ran"
    rescues = [chaos.rescue_seconds(shard_id, attempt, killed_at) for shard_id, attempt in orphans]
    chaos.wait_terminal([batch.id])
    figures.recovery_s = max(rescues)
    figures.sample_contention()
    figures.details.update(
        orphans=len(orphans), missed_kills=missed, shards_committed_before_kill=committed_before, rescue_s=rescues
    )
    output, _ = chaos.tally(figures, batch.id, lines)
    check_generation(chaos, figures, batch.id, lines, output)
    # Committed shards were not run again: one commit event per shard of the batch.
    commits = chaos.sql(
        "SELECT shard_index, count(*) FROM batches_batchevent WHERE batch_id=%s AND kind LIKE 'shard_succeeded' "
        "GROUP BY shard_index HAVING count(*) > 1",
        batch.id,
    )
    assert commits == [], f"shards committed twice: {commits}"
    recorder.add(figures)
    chaos.assert_clean(figures)
    assert figures.recovery_s <= figures.bound_s()

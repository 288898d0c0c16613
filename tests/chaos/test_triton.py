"""Triton killed and restarted empty, or hung, mid-batch.

Killed: the server comes back without its models (explicit mode); the heartbeat sees it live again and
the reconciler, which syncs what the server really has loaded, loads the model again. Recovery counts from
the model being ready on Triton (target 5 s). During the same outage one batch is cancelled and another
runs out of its completion window: both must end (cancelled / expired) while Triton is still down, every
line once, the unfinished ones as batch_cancelled / batch_expired errors.

Paused: SIGSTOP on Triton's process group (server and python-backend stubs), SIGCONT after a while. Calls
in flight just wait (the client's deadline is longer than the pause); recovery counts from SIGCONT."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.chaos.harness import PROFILE, RESUME_TARGET_S, STOP_TARGET_S, Figures

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

# In the chaos stack's BATCH_COMPLETION_WINDOWS. 20 s, not 10 s: on a loaded host (five pytest workers, load 17)
# the batch expired before its first shard had run, so the outage never met a running batch.
EXPIRY_WINDOW = "20s"


def _paused(chaos, tenants: list[str], paused: bool) -> None:
    for tenant in tenants:
        chaos.tenant_update(f"chaos-{tenant}", "paused=%s", paused)


def test_triton_killed_then_restarted(chaos, recorder):
    down_s = PROFILE.triton_down_s
    restart = Figures(f"Triton SIGKILL, restart after {down_s:g} s", target_s=RESUME_TARGET_S)
    cancel = Figures("cancel during a Triton outage", target_s=STOP_TARGET_S)
    expiry = Figures("expiry during a Triton outage", target_s=STOP_TARGET_S)
    survivor_lines = chaos.identity_lines("tkill")
    cancel_lines = chaos.identity_lines("tcancel")
    expiry_lines = chaos.identity_lines("texpire")
    survivor = chaos.submit(survivor_lines, tenant="a")
    to_cancel = chaos.submit(cancel_lines, tenant="b")
    chaos.wait_progress(survivor.id, shards=1)
    chaos.wait_progress(to_cancel.id, shards=1)
    # Held (their tenants paused: no new shard is dispatched) until Triton is down, so that both are still running
    # when it dies however fast the host: on a quick one the batch to cancel had completed while the expiry batch was
    # uploaded and validated and the contention sampled, and its cancel was a 409 (docs/reliability.md).
    _paused(chaos, ["a", "b"], True)
    # Last, because its short window makes it urgent: it would run before the others and finish first.
    to_expire = chaos.submit(expiry_lines, window=EXPIRY_WINDOW, tenant="c")
    chaos.wait_progress(to_expire.id, shards=1)

    for figures in (restart, cancel, expiry):
        figures.sample_contention()
    chaos.stack.kill("triton")
    killed_at = time.time()
    _paused(chaos, ["a", "b"], False)  # their shards now meet the dead Triton, as in the scenario
    assert chaos.status(survivor.id) == chaos.status(to_cancel.id) == "in_progress"
    chaos.clients["b"].batches.cancel(to_cancel.id)
    chaos.wait_for("cancelled", lambda: chaos.status(to_cancel.id) == "cancelled", cancel.bound_s() * 2)
    cancel.recovery_s = round(time.time() - killed_at, 2)
    expires_at = chaos.clients["c"].batches.retrieve(to_expire.id).expires_at
    chaos.wait_for("expired", lambda: chaos.status(to_expire.id) == "expired", max(0, expires_at - time.time()) + 60)
    expiry.recovery_s = round(time.time() - expires_at, 2)
    down_for = time.time() - killed_at
    assert "triton" not in chaos.stack.procs  # both ended while Triton was down: nothing waited for it

    time.sleep(max(0.0, killed_at + down_s - time.time()))
    chaos.stack.restart_triton()
    triton_ready_at = time.time()
    chaos.wait_for("model loaded again by the reconciler", chaos.model_ready, 120)
    model_ready_at = time.time()
    measured = chaos.resumed(model_ready_at, [survivor.id], timeout_s=120)
    restart.recovery_s = max(measured.values())
    restart.details.update(
        measured,
        down_s=round(triton_ready_at - killed_at, 1),
        reload_after_triton_ready_s=round(model_ready_at - triton_ready_at, 2),
    )
    cancel.details["cancel_to_cancelled_s"] = cancel.recovery_s
    expiry.details["expires_at_to_expired_s"] = expiry.recovery_s
    expiry.details["triton_down_when_expired_s"] = round(down_for, 1)
    chaos.tally(restart, survivor.id, survivor_lines)
    chaos.tally(cancel, to_cancel.id, cancel_lines, allowed_error_codes={"batch_cancelled"})
    chaos.tally(expiry, to_expire.id, expiry_lines, allowed_error_codes={"batch_expired"})
    for figures in (restart, cancel, expiry):
        figures.sample_contention()
        recorder.add(figures)
    for figures in (restart, cancel, expiry):
        chaos.assert_clean(figures)
        assert figures.recovery_s <= figures.bound_s(), figures


def test_triton_paused(chaos, recorder):
    pause_s = PROFILE.triton_pause_s
    figures = Figures(f"Triton SIGSTOP {pause_s:g} s", target_s=RESUME_TARGET_S)
    cancel = Figures("cancel while Triton is hung", target_s=STOP_TARGET_S)
    lines = chaos.identity_lines("tpause")
    cancel_lines = chaos.identity_lines("tpcancel")
    batch = chaos.submit(lines, tenant="a")
    to_cancel = chaos.submit(cancel_lines, tenant="b")
    chaos.wait_progress(batch.id)
    chaos.wait_progress(to_cancel.id, shards=1)
    resumed: list[float] = []

    def resume() -> None:
        chaos.stack.signal("triton", signal.SIGCONT)
        resumed.append(time.time())

    figures.sample_contention()
    cancel.sample_contention()
    chaos.stack.signal("triton", signal.SIGSTOP)
    timer = threading.Timer(pause_s, resume)
    timer.start()
    try:
        # Calls in flight now hang; a cancel must not wait for them (nor for the pause to end).
        time.sleep(min(2.0, pause_s / 4))
        cancelled_at = time.time()
        chaos.clients["b"].batches.cancel(to_cancel.id)
        chaos.wait_for("cancelled", lambda: chaos.status(to_cancel.id) == "cancelled", pause_s + 60)
        cancel.recovery_s = round(time.time() - cancelled_at, 2)
        cancel.details["while_hung"] = not resumed
    finally:
        timer.join()
    resumed_at = resumed[0]
    aborted = chaos.routable_or_restarted(120)
    routable_at = time.time()
    if aborted:  # started again: the resume counts from the models being ready, as after a kill
        resumed_at = routable_at
    measured = chaos.resumed(resumed_at, [batch.id], timeout_s=120)
    figures.recovery_s = max(measured.values())
    figures.details.update(
        measured, routable_after_sigcont_s=round(routable_at - resumed[0], 2), triton_aborted_on_resume=aborted
    )
    figures.sample_contention()
    cancel.contention = max(cancel.contention, figures.contention)
    chaos.tally(figures, batch.id, lines)
    chaos.tally(cancel, to_cancel.id, cancel_lines, allowed_error_codes={"batch_cancelled"})
    recorder.add(figures)
    recorder.add(cancel)
    chaos.assert_clean(figures)
    chaos.assert_clean(cancel)
    assert figures.recovery_s <= figures.bound_s()
    assert cancel.recovery_s <= cancel.bound_s()

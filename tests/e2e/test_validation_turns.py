"""Validation's turn through the real stack (batches/intake/turns.py): the validation worker's two processes, Redis,
the outbox. Two batches of one tenant validate one after the other (VALIDATION_MAX_PER_TENANT is 1), while another
tenant's batch, created after them, validates beside the first; every line of each is answered once. Judged by the
batches' own timestamps: when each took its validation turn and when it became in_progress."""

from __future__ import annotations

import uuid

import pytest

from tests.support.stack import assert_exactly_once, submit, tensor_lines

pytestmark = pytest.mark.e2e

TENSORS = "/v2/infer"


def _client(e2e, role: str):
    return e2e.sdk(e2e.new_tenant(f"turns-{role}-{uuid.uuid4().hex[:6]}"))


def test_a_tenants_second_batch_waits_its_turn_while_another_tenants_validates(e2e):
    a, b = _client(e2e, "a"), _client(e2e, "b")
    a_lines, b_lines = tensor_lines(1500, prefix="a"), tensor_lines(10, prefix="b")
    first = submit(a, a_lines, endpoint=TENSORS)
    second = submit(a, a_lines, endpoint=TENSORS)
    theirs = submit(b, b_lines, endpoint=TENSORS)
    for client, batch, lines in ((a, first, a_lines), (a, second, a_lines), (b, theirs, b_lines)):
        done = e2e.wait_status(client, batch.id, {"completed", "failed", "cancelled", "expired"})
        assert done.status == "completed", done
        assert_exactly_once(client, done, lines)
    (turns,) = [
        e2e.sql(
            "SELECT id, validation_started_at, in_progress_at, validation_attempt FROM batches_batch WHERE id IN "
            "(%s, %s, %s)",
            first.id,
            second.id,
            theirs.id,
        )
    ]
    rows = {row[0]: row[1:] for row in turns}
    a_windows = sorted((rows[first.id][:2], rows[second.id][:2]))
    # One of A's batches at a time: the later one took its turn only once the earlier was in_progress.
    assert a_windows[1][0] >= a_windows[0][1], a_windows
    # Each validated once: a waiting message never superseded an attempt.
    assert {row[2] for row in rows.values()} == {1}

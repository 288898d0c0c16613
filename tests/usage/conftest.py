from __future__ import annotations

import pytest

from controlplane.core.messaging import dispatch


@pytest.fixture(autouse=True)
def quiet(settings, monkeypatch):
    # Tasks enqueued on commit would run in-process; these tests drive the services themselves. Four lines a
    # shard: a batch of ten is three ledger rows.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4

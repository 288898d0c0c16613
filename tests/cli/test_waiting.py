"""The wait loop and its progress displays, with a scripted client and an in-memory console."""

from __future__ import annotations

import io
from types import SimpleNamespace

from openai.types import Batch
from rich.console import Console

from batchctl.waiting import RateMeter, batch_wait, eta_text
from tests.cli.fake_api import batch_json


def test_rate_over_the_trailing_window_and_eta():
    meter = RateMeter(window_seconds=10)
    assert meter.rate() is None and meter.eta_seconds(100) is None
    meter.add(-30.0, 0)  # waiting for the first shard: not part of the rate
    meter.add(0.0, 0)
    meter.add(5.0, 50)
    assert meter.rate() == 10.0
    assert meter.eta_seconds(100) == 10.0
    assert meter.eta_seconds(0) == 0.0
    # A slower pace later: the first samples leave the window and the rate follows.
    meter.add(20.0, 60)
    meter.add(25.0, 70)
    assert meter.samples[0] == (5.0, 50)  # one sample older than the window is kept, the rest dropped
    assert meter.rate() == 1.0
    assert eta_text(65.4) == "ETA 0:01:05"


class ScriptedClient:
    """``client.batches.retrieve`` answering the given states in turn."""

    def __init__(self, states: list[dict]):
        self.states = [Batch.model_validate(s) for s in states]
        self.calls = 0
        self.batches = SimpleNamespace(retrieve=self._retrieve)

    def _retrieve(self, batch_id: str) -> Batch:
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return state


STATES = [
    batch_json(status="validating"),
    batch_json(status="in_progress", done=0, total=40),
    batch_json(status="in_progress", done=10, total=40),
    batch_json(status="in_progress", done=10, total=40),
    batch_json(status="in_progress", done=28, failed=2, total=40),
    batch_json(status="completed", done=38, failed=2, total=40),
]


def _wait(console: Console) -> tuple[Batch, list[float]]:
    ticks = iter(range(100))
    slept: list[float] = []
    client = ScriptedClient(STATES)
    final = batch_wait(
        client, "batch_1", console=console, poll_seconds=0.5, clock=lambda: float(next(ticks)), sleep=slept.append
    )
    return final, slept


def test_plain_display_prints_a_line_per_change_with_rate_and_eta():
    buffer = io.StringIO()
    final, slept = _wait(Console(file=buffer, width=200, force_terminal=False, force_interactive=False))
    assert final.status == "completed"
    assert slept == [0.5] * 5
    lines = buffer.getvalue().splitlines()
    assert lines == [
        "validating: 0/0 lines, 0 failed, – lines/s, ETA –",
        "in_progress: 0/40 lines (0%), 0 failed, – lines/s, ETA –",
        "in_progress: 10/40 lines (25%), 0 failed, 10.0 lines/s, ETA 0:00:03",
        # the unchanged poll printed nothing
        "in_progress: 30/40 lines (75%), 2 failed, 10.0 lines/s, ETA 0:00:01",
        "completed: 40/40 lines (100%), 2 failed, 10.0 lines/s, ETA 0:00:00",
    ]


def test_a_terminal_gets_a_live_bar_with_counts_rate_and_eta():
    buffer = io.StringIO()
    final, _ = _wait(Console(file=buffer, width=160, force_terminal=True, force_interactive=True, color_system=None))
    assert final.status == "completed"
    screen = buffer.getvalue()
    assert "waiting for batch_1" in screen
    last_frame = screen.rsplit("\r", 1)[-1]
    assert "completed" in last_frame and "40/40 lines" in last_frame and "2 failed" in last_frame
    assert "10.0 lines/s" in screen and "ETA 0:00:0" in screen

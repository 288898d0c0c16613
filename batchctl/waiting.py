"""Polling a batch until it ends, with a live progress display: a rich bar on an interactive terminal, one
plain line per change elsewhere (CI logs, pipes), both with lines/s and an ETA from the same meter."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from batchctl.render import TERMINAL_STATUSES, counts

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch

# Lines/s is measured over this trailing window: long enough to smooth shard-sized steps (a shard
# commits many lines at once), short enough to follow a change of pace.
RATE_WINDOW_SECONDS = 30.0


class RateMeter:
    """Lines per second over a trailing window of (time, lines finished) samples; an ETA from it."""

    def __init__(self, window_seconds: float = RATE_WINDOW_SECONDS) -> None:
        self.window_seconds = window_seconds
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> None:
        if len(self.samples) == 1 and self.samples[0][1] == done:
            # Nothing finished yet: the clock starts at the last poll before the first lines land, so model
            # loading and queueing before the first commit do not drag the rate down for a whole window.
            self.samples[0] = (now, done)
            return
        self.samples.append((now, done))
        # Keep one sample older than the window so the rate spans the whole window.
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_seconds:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else None

    def eta_seconds(self, remaining: int) -> float | None:
        rate = self.rate()
        if remaining <= 0:
            return 0.0
        return remaining / rate if rate else None


def rate_text(rate: float | None) -> str:
    return f"{rate:.1f} lines/s" if rate is not None else "– lines/s"


def eta_text(seconds: float | None) -> str:
    return f"ETA {timedelta(seconds=round(seconds))}" if seconds is not None else "ETA –"


class PlainDisplay:
    """One line whenever the status or the counts change: readable in a log file."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.last: tuple[str, int, int, int] | None = None

    def update(self, batch: Batch, meter: RateMeter) -> None:
        completed, failed, total = counts(batch)
        state = (batch.status, completed, failed, total)
        if state == self.last:
            return
        self.last = state
        share = f" ({100 * (completed + failed) // total}%)" if total else ""
        eta = meter.eta_seconds(total - completed - failed) if total else None
        self.console.print(
            f"{batch.status}: {completed + failed}/{total} lines{share}, {failed} failed, "
            f"{rate_text(meter.rate())}, {eta_text(eta)}",
        )

    def close(self) -> None:
        pass


class BarDisplay:
    """A rich progress bar: status, bar, done/total, failed, lines/s, ETA, elapsed."""

    def __init__(self, console: Console, batch_id: str) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description:<11}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.fields[total_lines]} lines"),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[eta]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID = self.progress.add_task(
            "submitted", total=None, total_lines="?", failed=0, rate=rate_text(None), eta=eta_text(None)
        )
        console.print(f"waiting for {batch_id}")
        self.progress.start()

    def update(self, batch: Batch, meter: RateMeter) -> None:
        completed, failed, total = counts(batch)
        eta = meter.eta_seconds(total - completed - failed) if total else None
        self.progress.update(
            self.task,
            description=batch.status,
            completed=completed + failed,
            # Unknown until validation has counted the lines: the bar pulses meanwhile.
            total=total or None,
            total_lines=total or "?",
            failed=failed,
            rate=rate_text(meter.rate()),
            eta=eta_text(eta),
        )

    def close(self) -> None:
        self.progress.stop()


def batch_wait(
    client: OpenAI,
    batch_id: str,
    *,
    console: Console,
    poll_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Batch:
    """Retrieve the batch every ``poll_seconds`` until it ends; returns its final state. KeyboardInterrupt
    passes through (the caller says how to cancel); the display is closed either way."""
    meter = RateMeter()
    # Interactive, not merely a terminal: FORCE_COLOR in a CI log makes a terminal that cannot redraw a bar.
    display: PlainDisplay | BarDisplay = (
        BarDisplay(console, batch_id) if console.is_interactive else PlainDisplay(console)
    )
    try:
        while True:
            batch = client.batches.retrieve(batch_id)
            completed, failed, _ = counts(batch)
            if batch.status == "in_progress":
                meter.add(clock(), completed + failed)
            display.update(batch, meter)
            if batch.status in TERMINAL_STATUSES:
                return batch
            sleep(poll_seconds)
    finally:
        display.close()

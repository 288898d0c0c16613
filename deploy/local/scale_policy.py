"""What the local orchestrator decides on each tick (deploy/local/orchestrator.py runs the loop): a pure
function of the desired-servers gauge, the servers it runs and its bounds. No I/O, no clock: `now` is an
input, so the unit tests drive it tick by tick.

The contract is KEDA's with a `prometheus` trigger on `batch_fleet_desired_servers{pool}`: the control
plane says how many servers the pool should have, the orchestrator only follows, within its own
[min_servers, max_servers]. Two rules of its own, both Kubernetes' HPA behaviour:

* Scale-out at once; scale-in only to the highest desired value seen in the last `scale_in_window_s`
  (HPA's downscale stabilization window): a gauge that dips for one scrape does not cost a drain and a
  cold start a moment later.
* An unreadable gauge (scrape failed, pool absent) changes nothing but the bounds: an outage of the
  metrics endpoint must not drain the fleet. KEDA's `fallback` makes the same choice explicit.

Servers that are starting count as up (they will serve shortly); draining ones do not (they are leaving).
Scale-in drains the newest serving servers first, so the longest-lived ones, whose models are warm and
whose placements are settled, stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    min_servers: int = 0
    max_servers: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.min_servers <= self.max_servers:
            raise ValueError(f"need 0 <= min_servers <= max_servers, got {self.min_servers}, {self.max_servers}")

    def clamp(self, n: int) -> int:
        return max(self.min_servers, min(self.max_servers, n))


@dataclass(frozen=True)
class Observation:
    """One reading of the gauge: `desired` is None when it could not be read."""

    at: float
    desired: int | None


@dataclass(frozen=True)
class Decision:
    target: int  # servers this orchestrator should run after the decision
    start: int  # new servers to start now
    drain: tuple[str, ...]  # serving servers to drain and stop now, newest first
    reason: str

    @property
    def changes(self) -> bool:
        return bool(self.start or self.drain)


def decide(
    *,
    history: Sequence[Observation],
    now: float,
    serving: Sequence[str],
    starting: int,
    bounds: Bounds,
    scale_in_window_s: float,
    fixed_servers: int = 0,
) -> Decision:
    """The next step towards the gauge.

    `history`: readings so far, oldest first (the last one is this tick's). `serving`: names of the
    servers serving now, oldest first. `starting`: servers started but not yet registered.
    `fixed_servers`: servers of the pool that this orchestrator does not run (the runner's own Triton):
    the gauge counts the whole pool, so they are subtracted from it.
    """
    up = len(serving) + starting
    latest = history[-1] if history else None
    if latest is None or latest.desired is None:
        target = bounds.clamp(up)
        reason = "gauge unreadable: holding" if target == up else f"gauge unreadable: back within bounds {target}"
    else:
        recent = [o.desired for o in history if o.desired is not None and now - o.at <= scale_in_window_s]
        wanted = max(0, latest.desired - fixed_servers)
        # Growth follows the latest reading; shrinking only to the peak of the window.
        peak = max(0, max(recent, default=latest.desired) - fixed_servers)
        target = bounds.clamp(wanted if wanted >= up else min(up, peak))
        reason = f"desired {latest.desired}"
        if fixed_servers:
            reason += f" - {fixed_servers} fixed"
        if wanted < up and peak > wanted:
            reason += f", window peak {peak + fixed_servers} over the last {scale_in_window_s:g} s"
        if bounds.clamp(wanted) != wanted:
            reason += f", bounded to [{bounds.min_servers}, {bounds.max_servers}]"
    if target > up:
        return Decision(target, target - up, (), f"{reason}: start {target - up} ({up} up)")
    if target < up:
        # Starting servers cannot be drained yet; the next tick drains them if still too many.
        drain = tuple(reversed(serving))[: up - target]
        if not drain:
            return Decision(target, 0, (), f"{reason}: {up} up, waiting for starting servers before a drain")
        return Decision(target, 0, drain, f"{reason}: drain {', '.join(drain)} ({up} up)")
    return Decision(target, 0, (), f"{reason}: steady at {up}")

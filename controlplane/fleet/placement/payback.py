"""The payback rule shared by sizing and consolidation (planner.py's docstring states it): a new instance,
or a set of moves, must serve longer within the interval than it spends loading."""

from __future__ import annotations

import math


def payback_gain_s(pending: int, rate: float, instances: int, interval_s: float) -> float:
    """gain(n) = min(T, P / (n * r)): seconds each of n instances is busy within the interval."""
    return min(interval_s, pending / (instances * rate))


def affordable_instances(pending: int, rate: float, load_time_s: float, interval_s: float, cap: int) -> int:
    """Largest n in [0, cap] with gain(n) > L. gain(n) > L needs T > L and n < P / (r * L); the closed form
    is then nudged by one either way so float rounding cannot disagree with payback_gain_s."""
    if rate <= 0 or pending <= 0 or interval_s <= load_time_s:
        return 0
    if load_time_s <= 0:
        return cap
    n = max(0, min(cap, math.ceil(pending / (rate * load_time_s)) - 1))
    while n > 0 and not payback_gain_s(pending, rate, n, interval_s) > load_time_s:
        n -= 1
    while n < cap and payback_gain_s(pending, rate, n + 1, interval_s) > load_time_s:
        n += 1
    return n

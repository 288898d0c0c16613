"""Hypothesis strategies for the LoRA adapter residency plan (test_adapter_residency_properties.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from controlplane.fleet.placement.adapters import AdapterInstance, AdapterUse

# ADAPTER_EXAMPLES=5000 for a deep run; `make test-fast` runs fewer (the Makefile's FAST_ENV).
SETTINGS = settings(
    max_examples=int(os.environ.get("ADAPTER_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
NAMES = tuple(f"a{i}" for i in range(8))


@dataclass(frozen=True)
class Fleet:
    instances: tuple[AdapterInstance, ...]
    uses: dict[str, AdapterUse]
    hysteresis: float


@st.composite
def fleets(draw: st.DrawFn, *, within_capacity: bool = False) -> Fleet:
    """A base's instances (1-4 servers, capacity 1-4 or unlimited, some adapters loaded: within capacity or, now
    and then, over it), and demand for a subset of the adapters; some loaded adapters are unknown to the catalogue."""
    uses = {}
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=len(NAMES))):
        lines = draw(st.one_of(st.just(0), st.integers(1, 50), st.sampled_from([10, 12])))  # ties and near-ties
        last = draw(st.one_of(st.none(), st.integers(0, 5).map(float)))
        uses[name] = AdapterUse(pending_lines=lines, last_used_at=last)
    instances = []
    count = draw(st.integers(1, 4))
    for index in range(count):
        capacity = draw(st.one_of(st.none(), st.integers(1, 4)))
        most = len(NAMES) if capacity is None else capacity + (0 if within_capacity else draw(st.integers(0, 2)))
        loaded = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=most))
        instances.append(AdapterInstance(f"s{index}", frozenset(loaded), capacity))
    return Fleet(tuple(instances), uses, draw(st.sampled_from([0.0, 0.2, 0.5])))


def demanded(fleet: Fleet) -> set[str]:
    return {name for name, use in fleet.uses.items() if use.pending_lines > 0}


def total_capacity(fleet: Fleet) -> float:
    return sum(float("inf") if i.capacity is None else i.capacity for i in fleet.instances)

"""Hypothesis strategies and a small discrete-event simulator for the policy property tests.

The simulator: ``slots`` slots serve one shard each; a shard of W work units runs W / ``rate`` seconds.
Whenever slots are free (after finishes and arrivals at that instant), each takes the best-ranked
candidate's next shard and charges it at once, as the dispatcher does. A batch is a candidate while it
has unclaimed shards; its ``waiting_since`` is its last claim (or its arrival).
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from controlplane.scheduling.policy import Candidate, Clock, PolicyConfig, Priority, TenantShare, charge, rank

NOW = 100_000.0
# POLICY_EXAMPLES=5000 for a deep run; the default keeps tests/scheduling at a few seconds.
SETTINGS = settings(
    max_examples=int(os.environ.get("POLICY_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
NO_AGING = PolicyConfig(aging_seconds=math.inf, half_life_seconds=math.inf)


@dataclass
class Batch:
    batch_id: str
    tenant_id: int
    priority: Priority
    arrives_at: float
    shards: list[float]
    expires_at: float = math.inf
    claimed: int = 0
    unfinished: float = field(init=False)
    waiting_since: float = field(init=False)

    def __post_init__(self) -> None:
        self.unfinished = float(sum(self.shards))
        self.waiting_since = self.arrives_at


@dataclass(frozen=True)
class Claim:
    at: float
    batch_id: str
    tenant_id: int
    work: float


@dataclass
class Sim:
    claims: list[Claim]
    shares: dict[int, TenantShare]
    system: Clock
    runnable_at_end: set[str]  # batches with unclaimed shards when the simulation stopped

    def served(self, tenant_id: int, since: float = -math.inf) -> float:
        return sum(c.work for c in self.claims if c.tenant_id == tenant_id and c.at >= since)


def simulate(
    batches: Iterable[Batch],
    weights: Mapping[int, float],
    *,
    slots: int,
    rate: float,
    config: PolicyConfig,
    until: float,
    system: Clock | None = None,
) -> Sim:
    """Run until no event is left at or before ``until``. Asserts at every claim that rank kept every
    candidate (work conservation)."""
    pending = sorted(batches, key=lambda b: (b.arrives_at, b.batch_id))
    by_id = {b.batch_id: b for b in pending}
    active: list[Batch] = []
    running: list[tuple[float, int, str, float]] = []  # (finishes_at, seq, batch_id, work)
    shares: dict[int, TenantShare] = {}
    clock = system or Clock(0.0, 0.0)
    claims: list[Claim] = []
    free, seq = slots, 0
    while pending or running:
        t = min([b.arrives_at for b in pending[:1]] + [r[0] for r in running[:1]])
        if t > until:
            break
        while running and running[0][0] <= t:
            _, _, batch_id, work = heapq.heappop(running)
            by_id[batch_id].unfinished -= work
            free += 1
        while pending and pending[0].arrives_at <= t:
            active.append(pending.pop(0))
        while free:
            cands = [_candidate(b, slots * rate) for b in active if b.claimed < len(b.shards)]
            if not cands:
                break
            order = rank(cands, shares, clock, t, config)
            assert sorted(c.batch_id for c in order) == sorted(c.batch_id for c in cands)
            b = by_id[order[0].batch_id]
            work = b.shards[b.claimed]
            b.claimed += 1
            b.waiting_since = t
            shares[b.tenant_id], clock = charge(
                shares.get(b.tenant_id), b.tenant_id, weights[b.tenant_id], clock, work, t, config
            )
            claims.append(Claim(t, b.batch_id, b.tenant_id, work))
            heapq.heappush(running, (t + work / rate, seq, b.batch_id, work))
            seq += 1
            free -= 1
    left = {b.batch_id for b in active + pending if b.claimed < len(b.shards)}
    return Sim(claims, shares, clock, left)


def _candidate(b: Batch, throughput: float) -> Candidate:
    return Candidate(
        batch_id=b.batch_id,
        tenant_id=b.tenant_id,
        priority=b.priority,
        created_at=b.arrives_at,
        waiting_since=b.waiting_since,
        expires_at=b.expires_at,
        remaining_work=b.unfinished,
        throughput=throughput,
        next_shard_work=b.shards[b.claimed],
    )


def cycled(sizes: list[int], n: int) -> list[float]:
    """n shards cycling through ``sizes``: a long backlog without drawing thousands of values."""
    return [float(sizes[i % len(sizes)]) for i in range(n)]


# -- strategies for pure rank() tests ---------------------------------------------------------------------

PRIORITIES = st.sampled_from(list(Priority))
WEIGHTS = st.sampled_from([0.25, 0.5, 1.0, 1.0, 2.0, 3.0, 8.0])
SLOTS = st.integers(1, 4)
RATES = st.sampled_from([1.0, 2.5, 10.0])
SHARD_SIZES = st.lists(st.integers(1, 40), min_size=1, max_size=6)
_TIMES = st.floats(NOW - 5_000, NOW, allow_nan=False)
_EXPIRY = st.one_of(st.just(math.inf), st.floats(NOW - 10, NOW + 5_000, allow_nan=False))
_VTIMES = st.floats(0, 1_000, allow_nan=False)


@st.composite
def candidates(draw, min_size=0, max_size=8, expiry=_EXPIRY, priorities=PRIORITIES):
    n = draw(st.integers(min_size, max_size))
    out = []
    for i in range(n):
        out.append(
            Candidate(
                batch_id=f"b{draw(st.integers(0, 3))}-{i}",  # unique; the prefix mixes id order and list order
                tenant_id=draw(st.integers(1, 3)),
                priority=draw(priorities),
                created_at=draw(_TIMES),
                waiting_since=draw(_TIMES),
                expires_at=draw(expiry),
                remaining_work=draw(st.sampled_from([0.0, 1.0, 50.0, 1_000.0, 100_000.0])),
                throughput=draw(st.sampled_from([0.0, 1.0, 10.0, 100.0])),
                next_shard_work=draw(st.sampled_from([1.0, 10.0, 100.0])),
            )
        )
    return out


@st.composite
def shares(draw):
    out = {}
    for tenant_id in draw(st.sets(st.integers(1, 3))):
        clock = Clock(draw(_VTIMES), draw(_TIMES))
        out[tenant_id] = TenantShare(tenant_id, clock, draw(WEIGHTS))
    return out


CONFIGS = st.builds(
    PolicyConfig,
    aging_seconds=st.sampled_from([0.0, 60.0, 600.0, math.inf]),
    half_life_seconds=st.sampled_from([60.0, 3_600.0, math.inf]),
    deadline_fraction=st.sampled_from([0.0, 0.5, 1.0]),
    fifo=st.sampled_from([False, False, False, True]),
)
SYSTEM_CLOCKS = st.builds(Clock, _VTIMES, _TIMES)

"""Scheduler ordering policy: which runnable batch a free slot serves next, and how serving is charged.

Pure: no Django, no I/O, no clock (``now`` and every timestamp are float seconds passed in). The same
inputs always give the same order, whatever order the candidates come in (``batch_id`` breaks every tie).

Fair share is start-time fair queueing (SFQ/WFQ) over *virtual time*:

* Each tenant has a clock v (a ``Clock``: a value and the time it was last written) and a weight w > 0
  from the admin. Serving a shard of W work units advances the tenant's clock by W / w, so over any
  stretch where two tenants are both backlogged their served work divided by weight stays within a few
  shards of each other (see ``charge``).
* The system virtual time V is the start tag of the last served claim, V = max(V, start). A tenant with no
  clock yet, or one whose clock fell behind V while it was idle, starts at V: being idle banks no credit,
  and a new tenant joins level with the least-served backlogged one instead of at 0.
* Usage decays with a half-life H (Slurm-style): a clock read at ``now`` is
  v * 2 ** (-(now - at) / H). All clocks decay at the same rate, so decay never reorders tenants; it only
  makes the gap between them shrink over time. H = inf disables decay.

Order (``rank``) is by tier first, then within a tier:

* URGENT: deadline at risk, i.e. remaining_work / throughput > deadline_fraction * (expires_at - now),
  or promoted earlier (``deadline_promoted``: the caller records the first promotion and it sticks until
  the batch has no work left, so a promoted batch finishes as early as it can instead of riding the line
  down to its expiry). Ordered least slack first, slack = (expires_at - now) - remaining_work / throughput (the seconds to spare
  if the model served this batch alone), then by the tenant's virtual time. Deadlines outrank fairness on
  purpose: the point of the tier is to finish before expiry. A throughput of 0 means "unknown" and is
  never urgent (slack = inf); a batch with no expiry is never urgent.
* AGED: a NORMAL or LOW batch that no slot has served for ``aging_seconds`` (now - waiting_since >=
  aging_seconds). It outranks HIGH, so a steady stream of HIGH work cannot starve it: its gap between
  claims is at most aging_seconds plus the longest running shard (when the next slot frees).
* HIGH, NORMAL, LOW: the batch's class.

Outside URGENT the order within a tier is: the tenant's effective virtual time max(v, V) (least served
first), then slack, then created_at, then batch_id. ``rank`` returns every candidate (work-conserving:
a free slot never idles while anything is runnable); the caller claims from the front.

With ``fifo=True`` all of the above is ignored: order is (created_at, batch_id).

Charging happens at claim time with the shard's *estimated* work (so concurrent claims see each other) and
is corrected at commit by the difference to the measured work (``correct``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum

__all__ = [
    "Candidate",
    "Clock",
    "PolicyConfig",
    "Priority",
    "TenantShare",
    "Tier",
    "charge",
    "correct",
    "deadline_at_risk",
    "decayed",
    "effective_vtime",
    "rank",
    "slack",
    "start_estimates",
    "tier",
]


class Priority(str, Enum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


@dataclass(frozen=True)
class PolicyConfig:
    aging_seconds: float = 600.0  # a normal/low batch not served for this long outranks HIGH
    half_life_seconds: float = 3600.0  # usage half-life of virtual time; math.inf = no decay
    deadline_fraction: float = 0.5  # urgent when the work left needs more than this share of the time left
    fifo: bool = False  # plain FIFO: (created_at, batch_id), ignoring everything else

    def __post_init__(self) -> None:
        if not self.aging_seconds >= 0:
            raise ValueError(f"aging_seconds must be >= 0, got {self.aging_seconds!r}")
        if not self.half_life_seconds > 0:
            raise ValueError(f"half_life_seconds must be > 0, got {self.half_life_seconds!r}")
        if not self.deadline_fraction >= 0:
            raise ValueError(f"deadline_fraction must be >= 0, got {self.deadline_fraction!r}")


@dataclass(frozen=True)
class Clock:
    """A virtual time value stamped with when it was last updated."""

    vtime: float
    at: float


@dataclass(frozen=True)
class TenantShare:
    tenant_id: int
    clock: Clock
    weight: float  # > 0


@dataclass(frozen=True)
class Candidate:
    """One batch that has at least one runnable shard."""

    batch_id: str
    tenant_id: int
    priority: Priority
    created_at: float
    waiting_since: float  # when a shard of this batch was last claimed, or when it became runnable
    expires_at: float
    remaining_work: float  # work units (tokens or rows) not finished yet
    throughput: float  # work units per second the model sustains; <= 0 means unknown
    next_shard_work: float  # estimated work units of the shard a claim would take
    # Promotion is sticky: a batch found at risk stays URGENT until it has no work left. Otherwise one
    # served shard drops it back under the line, and it rides the line down to finish at expires_at.
    deadline_promoted: bool = False


class Tier(IntEnum):
    URGENT = 0
    AGED = 1
    HIGH = 2
    NORMAL = 3
    LOW = 4


_CLASS_TIER = {Priority.HIGH: Tier.HIGH, Priority.NORMAL: Tier.NORMAL, Priority.LOW: Tier.LOW}


def decayed(clock: Clock, now: float, config: PolicyConfig) -> float:
    """clock.vtime * 2 ** (-(now - clock.at) / half_life); a clock from the future is read as of now."""
    if math.isinf(config.half_life_seconds):
        return clock.vtime
    elapsed = max(0.0, now - clock.at)
    return clock.vtime * math.exp2(-elapsed / config.half_life_seconds)


def effective_vtime(share: TenantShare | None, system: Clock, now: float, config: PolicyConfig) -> float:
    """max(v, V), both decayed to now: an idle or new tenant (no share) starts at V, the current minimum."""
    floor = decayed(system, now, config)
    if share is None:
        return floor
    return max(decayed(share.clock, now, config), floor)


def slack(candidate: Candidate, now: float) -> float:
    """(expires_at - now) - remaining_work / throughput: seconds to spare; inf when throughput is unknown."""
    if candidate.throughput <= 0:
        return math.inf
    return (candidate.expires_at - now) - candidate.remaining_work / candidate.throughput


def deadline_at_risk(candidate: Candidate, now: float, config: PolicyConfig) -> bool:
    """remaining_work / throughput > deadline_fraction * (expires_at - now). Never with an unknown (<= 0)
    throughput, no expiry (inf) or no work left. An already expired batch is at risk until it is failed."""
    if candidate.throughput <= 0 or math.isinf(candidate.expires_at) or candidate.remaining_work <= 0:
        return False
    needed = candidate.remaining_work / candidate.throughput
    return needed > config.deadline_fraction * (candidate.expires_at - now)


def tier(candidate: Candidate, now: float, config: PolicyConfig) -> Tier:
    if candidate.deadline_promoted or deadline_at_risk(candidate, now, config):
        return Tier.URGENT
    if candidate.priority is not Priority.HIGH and now - candidate.waiting_since >= config.aging_seconds:
        return Tier.AGED
    return _CLASS_TIER[candidate.priority]


def rank(
    candidates: Sequence[Candidate],
    shares: Mapping[int, TenantShare],
    system: Clock,
    now: float,
    config: PolicyConfig,
) -> list[Candidate]:
    """Every candidate, best first (never drops one). Key: tier; then, in URGENT, slack before the tenant's
    effective virtual time, elsewhere virtual time before slack; then created_at, then batch_id.
    With ``config.fifo``: (created_at, batch_id) only."""
    if config.fifo:
        return sorted(candidates, key=lambda c: (c.created_at, c.batch_id))
    vtimes: dict[int, float] = {}

    def key(c: Candidate) -> tuple[int, float, float, float, str]:
        if c.tenant_id not in vtimes:
            vtimes[c.tenant_id] = effective_vtime(shares.get(c.tenant_id), system, now, config)
        t, v, s = tier(c, now, config), vtimes[c.tenant_id], slack(c, now)
        if t is Tier.URGENT:
            return (t, s, v, c.created_at, c.batch_id)
        return (t, v, s, c.created_at, c.batch_id)

    return sorted(candidates, key=key)


def charge(
    share: TenantShare | None,
    tenant_id: int,
    weight: float,
    system: Clock,
    work: float,
    now: float,
    config: PolicyConfig,
) -> tuple[TenantShare, Clock]:
    """Charge a claim of ``work`` estimated units. start = max(v, V) decayed to now; the tenant's clock
    becomes start + work / weight and V becomes max(V, start), both stamped ``now``. Returns (share, V).

    Why the bounds in the property tests hold: the served tenant is the least-v one of its tier, so V never
    passes a backlogged tenant of that tier, and each claim moves one clock by at most S / w (S the largest
    shard). Two tenants backlogged together therefore stay within max(S/wA, S/wB) of each other in virtual
    time, and a tenant that comes back finds the others at most one shard (S / w) ahead of V."""
    if not weight > 0:
        raise ValueError(f"weight must be > 0, got {weight!r}")
    if not work >= 0:
        raise ValueError(f"work must be >= 0, got {work!r}")
    start = effective_vtime(share, system, now, config)
    new_share = TenantShare(tenant_id, Clock(start + work / weight, now), weight)
    new_system = Clock(max(decayed(system, now, config), start), now)
    return new_share, new_system


def correct(share: TenantShare, work_delta: float, now: float, config: PolicyConfig) -> TenantShare:
    """At commit: add (measured - estimated) work / weight to the decayed clock, never below 0."""
    vtime = max(0.0, decayed(share.clock, now, config) + work_delta / share.weight)
    return TenantShare(share.tenant_id, Clock(vtime, now), share.weight)


def start_estimates(ranked: Sequence[Candidate], throughput: float) -> dict[str, float]:
    """Seconds until each batch's next shard is expected to start: the next_shard_work of every candidate
    ahead of it ÷ throughput. 0 for the first; inf behind anything when throughput is unknown (<= 0)."""
    out: dict[str, float] = {}
    ahead = 0.0
    for i, c in enumerate(ranked):
        if i == 0:
            out[c.batch_id] = 0.0
        else:
            out[c.batch_id] = ahead / throughput if throughput > 0 else math.inf
        ahead += c.next_shard_work
    return out

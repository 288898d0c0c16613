"""Which LoRA adapters each placed instance of a base model holds: a pure function of plain values (no Django,
no I/O, no clock), property-tested in tests/fleet/test_adapter_residency_properties.py.

The engine loads an adapter on the first request that names it and, at its MAX_LORAS, drops the least recently
named one, so every replica can serve every adapter; this plan loads adapters ahead of their lines and keeps the
ones with work resident. Rules, in order:

1. An instance over its capacity drops adapters until it fits: demandless ones first (least recently used first),
   then the least demanded.
2. Each adapter with demand, most demanded first, that no instance holds is loaded on one instance: one with a
   free slot (the emptiest), else in place of a demandless adapter (the least recently used one of the fleet),
   else in place of a second copy of a demanded adapter (the least demanded copy), else in place of a demanded
   adapter held nowhere else whose demand × (1 + hysteresis) is below its own (the least demanded): so an adapter
   with demand is never unloaded while a demandless one holds a slot, and two adapters of equal demand never swap.
3. Free slots left are filled with second copies of adapters with demand (most demanded first; never evicting),
   since dispatch routes a line to any replica of its base.

A demandless adapter is unloaded only when its slot is needed. Applied to its own result, the plan is empty."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ActionKind", "AdapterAction", "AdapterInstance", "AdapterUse", "ResidencyPlan", "residency_plan"]


@dataclass(frozen=True)
class AdapterInstance:
    """One placed instance of the base (a server it is loaded on): what its engine holds now and how many
    adapters it may hold (None: no limit)."""

    server: str
    loaded: frozenset[str]
    capacity: int | None = None


@dataclass(frozen=True)
class AdapterUse:
    """An adapter's lines waiting or running, and when it last had any (seconds; None: never seen)."""

    pending_lines: int = 0
    last_used_at: float | None = None


class ActionKind(StrEnum):
    LOAD = "adapter_load"
    UNLOAD = "adapter_unload"


@dataclass(frozen=True)
class AdapterAction:
    server: str
    kind: ActionKind
    adapter: str
    reason: str


@dataclass(frozen=True)
class ResidencyPlan:
    target: dict[str, frozenset[str]]  # server → adapters it should hold
    actions: tuple[AdapterAction, ...]  # per server, unloads before loads (a slot is freed before it is used)


def residency_plan(
    instances: Iterable[AdapterInstance], uses: Mapping[str, AdapterUse], *, hysteresis: float = 0.2
) -> ResidencyPlan:
    ordered = sorted(instances, key=lambda i: i.server)
    capacity = {i.server: i.capacity for i in ordered}
    held: dict[str, set[str]] = {i.server: set(i.loaded) for i in ordered}
    reasons: dict[tuple[str, str], str] = {}

    def demand(name: str) -> int:
        use = uses.get(name)
        return use.pending_lines if use is not None else 0

    def idle_key(name: str) -> tuple[float, str]:  # least recently used first; never used before all
        use = uses.get(name)
        last = use.last_used_at if use is not None and use.last_used_at is not None else float("-inf")
        return (last, name)

    def copies(name: str) -> int:
        return sum(name in names for names in held.values())

    def room(server: str) -> bool:
        limit = capacity[server]
        return limit is None or len(held[server]) < limit

    # 1. Over capacity: drop demandless (LRU) first, then the least demanded.
    for server, names in held.items():
        limit = capacity[server]
        while limit is not None and len(names) > limit:
            victim = min(names, key=lambda n: (demand(n) > 0, demand(n), idle_key(n)))
            names.discard(victim)
            reasons[(server, victim)] = f"over the instance's {limit} adapter slots"

    wanted = sorted((name for name, use in uses.items() if use.pending_lines > 0), key=lambda n: (-demand(n), n))

    # 2. Every adapter with demand held somewhere, while capacity allows.
    for name in wanted:
        if copies(name):
            continue
        free = [s for s in held if room(s)]
        if free:
            server = min(free, key=lambda s: (len(held[s]), s))
            held[server].add(name)
            reasons[(server, name)] = f"{demand(name)} lines waiting, held nowhere"
            continue
        choice = _slot_to_take(held, name, demand, idle_key, hysteresis)
        if choice is None:
            continue  # every slot holds an adapter at least as demanded
        server, victim, why = choice
        held[server].discard(victim)
        held[server].add(name)
        reasons[(server, victim)] = f"slot taken by {name} ({demand(name)} lines): {why}"
        reasons[(server, name)] = f"{demand(name)} lines waiting, held nowhere"

    # 3. Free slots take further copies of adapters with demand.
    for name in wanted:
        for server in held:
            if name not in held[server] and room(server):
                held[server].add(name)
                reasons[(server, name)] = f"{demand(name)} lines waiting, a free slot"

    actions: list[AdapterAction] = []
    for instance in ordered:
        server, now = instance.server, held[instance.server]
        actions += [
            AdapterAction(server, ActionKind.UNLOAD, n, reasons.get((server, n), ""))
            for n in sorted(instance.loaded - now)
        ]
        actions += [
            AdapterAction(server, ActionKind.LOAD, n, reasons.get((server, n), ""))
            for n in sorted(now - instance.loaded)
        ]
    return ResidencyPlan({s: frozenset(names) for s, names in held.items()}, tuple(actions))


def _slot_to_take(
    held: dict[str, set[str]],
    name: str,
    demand: Callable[[str], int],
    idle_key: Callable[[str], tuple[float, str]],
    hysteresis: float,
) -> tuple[str, str, str] | None:
    """The slot an unheld adapter with demand takes when none is free: (server, adapter to unload, why)."""

    def copies(adapter: str) -> int:
        return sum(adapter in names for names in held.values())

    idle = [(idle_key(v), s, v) for s, names in held.items() for v in names if demand(v) == 0]
    if idle:
        _, server, victim = min(idle)
        return server, victim, "least recently used without demand"
    spare = [(demand(v), v, s) for s, names in held.items() for v in names if copies(v) > 1]
    if spare:
        _, victim, server = min(spare)
        return server, victim, "a second copy"
    weaker = [
        (demand(v), v, s) for s, names in held.items() for v in names if demand(v) * (1 + hysteresis) < demand(name)
    ]
    if weaker:
        _, victim, server = min(weaker)
        return server, victim, f"less demand ({demand(victim)} lines)"
    return None

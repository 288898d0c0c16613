"""Properties of the LoRA adapter residency plan (controlplane/fleet/placement/adapters.py), over generated
fleets of one base: capacity, coverage of demanded adapters, what may be unloaded, stability, determinism."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given

from controlplane.fleet.placement.adapters import (
    ActionKind,
    AdapterInstance,
    AdapterUse,
    ResidencyPlan,
    residency_plan,
)
from tests.fleet.adapter_strategies import SETTINGS, Fleet, demanded, fleets, total_capacity


def _plan(fleet: Fleet) -> ResidencyPlan:
    return residency_plan(fleet.instances, fleet.uses, hysteresis=fleet.hysteresis)


def _applied(fleet: Fleet, plan: ResidencyPlan) -> Fleet:
    return replace(fleet, instances=tuple(replace(i, loaded=plan.target[i.server]) for i in fleet.instances))


@SETTINGS
@given(fleets())
def test_actions_turn_what_is_loaded_into_the_target_within_capacity(fleet):
    plan = _plan(fleet)
    for instance in fleet.instances:
        held = set(instance.loaded)
        for action in (a for a in plan.actions if a.server == instance.server):
            (held.discard if action.kind == ActionKind.UNLOAD else held.add)(action.adapter)
        assert held == plan.target[instance.server]
        if instance.capacity is not None:
            assert len(held) <= instance.capacity


@SETTINGS
@given(fleets())
def test_every_demanded_adapter_is_held_while_capacity_allows(fleet):
    plan = _plan(fleet)
    held = set().union(*plan.target.values())
    wanted = demanded(fleet)
    assert len(wanted & held) == min(len(wanted), total_capacity(fleet))
    assert held <= wanted | set().union(*(i.loaded for i in fleet.instances))  # nothing demandless is loaded


@SETTINGS
@given(fleets(within_capacity=True))
def test_no_demanded_adapter_goes_while_a_demandless_one_holds_a_slot(fleet):
    plan = _plan(fleet)
    wanted = demanded(fleet)
    unloaded = [a for a in plan.actions if a.kind == ActionKind.UNLOAD]
    if any(a.adapter in wanted for a in unloaded):
        assert all(name in wanted for names in plan.target.values() for name in names)
    # A demandless adapter goes only for a slot a demanded one takes, and never while a slot is free.
    for action in unloaded:
        if action.adapter not in wanted:
            loads = [a for a in plan.actions if a.server == action.server and a.kind == ActionKind.LOAD]
            assert loads, action
            assert all(i.capacity is not None and len(plan.target[i.server]) == i.capacity for i in fleet.instances)


@SETTINGS
@given(fleets(within_capacity=True))
def test_the_demandless_adapter_unloaded_is_the_least_recently_used(fleet):
    plan = _plan(fleet)
    wanted = demanded(fleet)

    def last(name):
        use = fleet.uses.get(name)
        return float("-inf") if use is None or use.last_used_at is None else use.last_used_at

    gone = [a.adapter for a in plan.actions if a.kind == ActionKind.UNLOAD and a.adapter not in wanted]
    kept = [n for names in plan.target.values() for n in names if n not in wanted]
    for name in gone:
        assert all(last(name) <= last(other) for other in kept), (name, kept)


@SETTINGS
@given(fleets())
def test_the_plan_applied_to_its_own_result_does_nothing(fleet):
    plan = _plan(fleet)
    again = _plan(_applied(fleet, plan))
    assert again.actions == ()
    assert again.target == plan.target


@SETTINGS
@given(fleets())
def test_the_plan_is_deterministic_whatever_the_order_of_its_inputs(fleet):
    plan = _plan(fleet)
    shuffled = residency_plan(
        tuple(reversed(fleet.instances)), dict(reversed(list(fleet.uses.items()))), hysteresis=fleet.hysteresis
    )
    assert shuffled == plan == _plan(fleet)


def test_equal_demand_does_not_swap_and_a_clear_lead_does():
    one = AdapterInstance("s0", frozenset({"a"}), capacity=1)
    even = {"a": AdapterUse(10), "b": AdapterUse(10)}
    assert residency_plan([one], even, hysteresis=0.2).actions == ()
    inside_band = {"a": AdapterUse(10), "b": AdapterUse(11)}
    assert residency_plan([one], inside_band, hysteresis=0.2).actions == ()
    lead = {"a": AdapterUse(10), "b": AdapterUse(13)}
    plan = residency_plan([one], lead, hysteresis=0.2)
    assert [(a.kind, a.adapter) for a in plan.actions] == [(ActionKind.UNLOAD, "a"), (ActionKind.LOAD, "b")]


def test_demand_moves_to_an_idle_adapter_on_a_full_instance():
    full = AdapterInstance("s0", frozenset({"reverse"}), capacity=1)
    uses = {"double": AdapterUse(5, last_used_at=2.0), "reverse": AdapterUse(0, last_used_at=1.0)}
    assert residency_plan([full], uses).target == {"s0": frozenset({"double"})}

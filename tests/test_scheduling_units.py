"""The suite's own xdist scheduling (tests/conftest.py): which tests share a worker, and what starts first."""

from __future__ import annotations

from tests.conftest import _GROUPS, _START_ORDER, scheduling_unit, start_rank


def test_every_group_has_a_start_rank_so_a_new_group_does_not_start_last():
    assert {group for _, group in _GROUPS} == set(_START_ORDER)


def test_groups_start_before_units_and_units_before_single_tests():
    scopes = [
        scheduling_unit("tests/test_api.py::test_x"),
        scheduling_unit("tests/tinylm/test_cb_engine.py::test_y"),
        scheduling_unit("tests/triton/test_triton_tinylm.py::test_z"),
        scheduling_unit("tests/e2e/test_placement.py::test_w"),
        scheduling_unit("tests/e2e/test_sdk.py::test_v"),
    ]
    assert sorted(scopes, key=start_rank) == [
        "fleets",
        "stack",
        "processes",
        "unit:tinylm",
        "tests/test_api.py::test_x",
    ]

"""The suite's own xdist scheduling (tests/plugins/scheduling.py): which tests share a worker, and what starts first."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from tests.plugins import scheduling
from tests.plugins.scheduling import _GROUPS, _START_ORDER, pytest_xdist_make_scheduler, scheduling_unit, start_rank


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


class _Node:
    """What xdist's scheduler asks of a worker: the test indexes it is sent, and a shutdown."""

    def __init__(self, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True


def test_xdist_hands_each_worker_a_group_first_then_the_rest():
    # Through xdist's own scheduler code, so a renamed hook in a later xdist fails here, not silently in CI's time.
    collection = [
        "tests/batches/test_a.py::test_one",
        "tests/batches/test_a.py::test_two",
        "tests/tinylm/test_engine.py::test_x",
        "tests/tinylm/test_engine.py::test_y",
        "tests/tinylm/test_engine.py::test_z",
        "tests/e2e/test_sdk.py::test_s",
        "tests/e2e/test_placement.py::test_p",
    ]
    config = SimpleNamespace(getvalue=lambda name: ["3*popen"], option=SimpleNamespace(loadscopereorder=True))
    scheduler = pytest_xdist_make_scheduler(config, None)
    nodes = [_Node(f"gw{i}") for i in range(3)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    first = [[collection[i] for i in node.sent[0]] for node in nodes]
    # xdist's own order would have started the tinylm unit (three tests) first and the fleets group last.
    assert first == [
        ["tests/e2e/test_placement.py::test_p"],
        ["tests/e2e/test_sdk.py::test_s"],
        [
            "tests/tinylm/test_engine.py::test_x",
            "tests/tinylm/test_engine.py::test_y",
            "tests/tinylm/test_engine.py::test_z",
        ],
    ]


def test_every_module_on_the_session_tritonserver_is_in_a_group():
    # A module that uses the session tritonserver (tests/support/triton_fixture.py) outside a group starts one on
    # whichever worker draws it, and `make test-fast` (which starts none) runs it.
    root = Path(__file__).resolve().parents[2]
    users = [
        path.relative_to(root).as_posix()
        for path in sorted((root / "tests").rglob("test_*.py"))
        if re.search(r"^from tests\.support\.triton_fixture import", path.read_text(), flags=re.M)
    ]
    assert users
    assert [module for module in users if scheduling.test_group(f"{module}::test") is None] == []

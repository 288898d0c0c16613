"""Which tests share an xdist worker and in what order the work is handed out (tests/plugins/test_scheduling.py
holds it to that), and what ``--fast`` leaves out."""

from __future__ import annotations

from typing import Any

import pytest

# `make test` runs the suite in pytest-xdist workers. Tests that share an expensive fixture run on one worker as
# a group, so each fixture starts once, not once per worker: the end-to-end stack (gunicorn, workers, beat, a
# tritonserver), the chaos suite's own stacks (one after another), the scenarios on fleets of their own, and
# the modules on a tritonserver of their own. Everything else spreads over all workers, test by test.
# Groups are decided from the test's path: xdist's own `xdist_group` marks do not reach its scheduler under
# pytest 9 (xdist 3.8 renames `item._nodeid`, which pytest 9 no longer reads), so the scheduler is ours.
_GROUPS = (
    # Scenarios on a fleet or stack of their own (no shared fixture): a group beside the stack group rather than
    # after it on one worker, where they made it the suite's critical path (10m52s of 10m52s, 2026-12-02).
    # test_tracing.py stays in the stack group: beside the other fleets it lost two of a batch's three shard
    # spans once, and in the stack group one: its wait ended on the finalize span and the calls, while each
    # process exports on its own schedule, so a shard's span could still be on its way (it now waits for every
    # span it asserts on). It also failed once on Triton's gRPC frontend, which starts a root trace for a few
    # percent of calls (docs/architecture/tracing.md, "Known limits").
    ("tests/e2e/test_gang_placement.py", "fleets"),
    ("tests/e2e/test_autoscale.py", "fleets"),
    ("tests/e2e/test_placement.py", "fleets"),
    ("tests/e2e/test_consolidation.py", "fleets"),
    ("tests/e2e/test_observability.py", "fleets"),
    # Chaos on its own stacks, beside the shared one: together they were the suite's critical path (767 s of an
    # 801 s run, 2026-12-03), and both mostly wait (outages, restarts: 473 CPU-s in those 767 s). A group of its
    # own needs a worker of its own: on three workers the four groups held every worker and the ~1,600 other
    # tests waited until one ended (8 % done after 13 min, 2026-12-02), hence TEST_WORKERS=5 in the Makefile.
    ("tests/chaos/", "chaos"),
    ("tests/e2e/", "stack"),
    ("tests/triton/", "processes"),
    ("tests/build_engines/test_serving.py", "processes"),
    ("tests/deploy/test_orchestrator.py", "processes"),
    ("tests/deploy/test_supervision.py", "processes"),
    ("tests/deploy/test_metric_references.py", "processes"),
    ("tests/fleet/test_membership.py", "processes"),
    ("tests/fleet/test_membership_triton.py", "processes"),
    ("tests/fleet/test_readiness.py", "processes"),
    ("tests/fleet/test_reconciler.py", "processes"),
    ("tests/metrics/", "processes"),
    ("tests/console/test_samples.py", "processes"),
    ("tests/kinds/test_generation_batch.py", "processes"),
    # On the same session tritonserver as test_generation_batch.py, with tinylm loaded once, not on a server of
    # its own wherever it fell among the spread tests (and in `make test-fast`, which starts none).
    ("tests/kinds/test_generation_cancel.py", "processes"),
    ("tests/kinds/test_generation_adapters_batch.py", "processes"),
    ("tests/fleet/test_adapter_reconcile.py", "processes"),
    # A tritonserver of its own for each search, as test_serving.py's.
    ("tests/build_engines/test_tune_serving.py", "processes"),
    ("tests/build_engines/test_tune_generation_serving.py", "processes"),
)


# `--fast` also leaves out these modules of no group: each spends most of its time in processes it starts (a
# nested pytest, torch exports, the local runner's children, advisory-lock holders, deploy checks). `make test`
# still runs them.
_FAST_LEAVES_OUT = (
    "tests/build_engines/test_build.py",
    "tests/build_engines/test_emit.py",  # the `built` fixture: a torch export and ONNX checks, ~12 CPU-s
    "tests/build_engines/test_pipeline.py",
    "tests/core/test_idempotency_sqlite.py",
    "tests/deploy/test_check_deploy.py",
    "tests/deploy/test_runner_children.py",
    "tests/deploy/test_singleton.py",
    "tests/tools/test_mutation_sample.py",  # cosmic-ray sessions in subprocesses, ~5 CPU-s
)


# Modules that share a costly session fixture run as one unit on one worker, so the fixture is made once, not on
# every worker that draws one of their tests: `built` (tests/build_engines/conftest.py: a torch export, ONNX
# checks and emits, ~8 CPU-s) was made on three workers of `make test-fast` (30 of its ~220 CPU-s). Not a group:
# `--fast` keeps them, and a unit is no more than these modules' own tests.
_UNITS = (
    ("tests/build_engines/test_emit.py", "built"),
    ("tests/build_engines/test_build.py", "built"),
    ("tests/build_engines/test_pipeline.py", "built"),
    # tinylm's engine in process: torch and the model loaded once (`engine`, `hf_dir`), not on each worker that
    # drew one of its ~25 tests (~2.5 CPU-s each).
    ("tests/tinylm/", "tinylm"),
)


# Which scheduling units start first. xdist's default order (most tests first) started the five workers on the
# processes group, the stack group, chaos, tinylm's unit and the build_engines unit, and queued the fleets group (8
# tests, ~380 s of wall) behind tinylm's unit: it started 24 s late and its last test ended the run (2026-12-06).
# The groups are the run's critical path, so they start at once, the longest first; a stable sort keeps xdist's
# order within each rank (tests/test_scheduling_units.py runs xdist's scheduler on it).
_START_ORDER = ("fleets", "stack", "chaos", "processes")


def start_rank(scope: str) -> int:
    if scope in _START_ORDER:
        return _START_ORDER.index(scope)
    return len(_START_ORDER) + (0 if scope.startswith("unit:") else 1)


def scheduling_unit(nodeid: str) -> str:
    """What one worker takes at once: a group, a unit sharing a session fixture, or the test alone."""
    for prefix, unit in _UNITS:
        if nodeid.startswith(prefix):
            return f"unit:{unit}"
    return test_group(nodeid) or nodeid


def test_group(nodeid: str) -> str | None:
    for prefix, group in _GROUPS:
        if nodeid.startswith(prefix):
            return group
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="`make test-fast`: leave out what starts processes (the stack, chaos, a tritonserver)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return

    def fast(nodeid: str) -> bool:
        return test_group(nodeid) is None and not nodeid.startswith(_FAST_LEAVES_OUT)

    kept = [item for item in items if fast(item.nodeid)]
    left_out = [item for item in items if not fast(item.nodeid)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """A group is one unit of work for one worker, and so is each of _UNITS; any other test is one of its own.
        Groups are handed out first, the longest first (_START_ORDER), then the units, then the single tests."""

        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the queue is complete at the first assignment and only shrinks after it
                for scope in sorted(self.workqueue, key=start_rank):
                    self.workqueue.move_to_end(scope)
                self._ordered = True
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)

"""`make mutation`'s sampled pass (scripts/mutation.py ``--sample``): a fixed number of mutants a module, the same
ones whenever the module's source is the same, though cosmic-ray gives its mutants new job ids at every init."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.mutation import _sample

COSMIC_RAY = str(Path(sys.executable).parent / "cosmic-ray")
SOURCE = """
def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value + 0 * 1 - 0


def between(value, low, high):
    return low <= value and value <= high or value == low
"""


def _session(root: Path, name: str) -> Path:
    """A cosmic-ray session of SOURCE's mutants, made as scripts/mutation.py makes one (`cosmic-ray init`)."""
    (root / "target.py").write_text(SOURCE)
    config = root / "config.toml"
    config.write_text(
        '[cosmic-ray]\nmodule-path = "target.py"\ntimeout = 10\nexcluded-modules = []\ntest-command = "true"\n'
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    session = root / f"{name}.sqlite"
    subprocess.run([COSMIC_RAY, "init", str(config), str(session)], cwd=root, check=True)
    return session


def _drawn(session: Path) -> tuple[set[tuple], int, int]:
    """The mutants left to run (by what they change), and how many mutants there are and how many were skipped."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = {
            tuple((m.operator_name, m.occurrence, tuple(m.start_pos)) for m in item.mutations)
            for item in db.pending_work_items
        }
        done = [result for _, result in db.completed_work_items]
    assert all(result.worker_outcome == WorkerOutcome.SKIPPED for result in done), done
    return pending, len(pending) + len(done), len(done)


def test_a_sample_leaves_that_many_mutants_to_run_and_draws_the_same_ones_for_the_same_source(tmp_path: Path):
    first, second, other = (_session(tmp_path, n) for n in ("first", "second", "other"))
    _, total, _ = _drawn(first)
    assert total > 20, "SOURCE should give enough mutants for a draw to mean something"
    for session in (first, second):
        _sample(session, 5, seed=SOURCE)
    _sample(other, 5, seed=SOURCE + "# changed")
    drawn, total_after, skipped = _drawn(first)
    assert (len(drawn), total_after, skipped) == (5, total, total - 5)
    assert _drawn(second)[0] == drawn  # new job ids, the same mutants
    assert _drawn(other)[0] != drawn  # another source, another draw


def test_a_sample_larger_than_the_module_runs_every_mutant(tmp_path: Path):
    session = _session(tmp_path, "all")
    _, total, _ = _drawn(session)
    _sample(session, total + 10, seed=SOURCE)
    assert _drawn(session)[1:] == (total, 0)
    assert len(_drawn(session)[0]) == total

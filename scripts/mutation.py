"""Mutation testing of the modules that guard correctness (`make mutation`, docs/RELIABILITY.md), with cosmic-ray.

Each module's mutants are applied one at a time to a scratch copy of the repository (cosmic-ray edits files in
place; the working tree is never touched), and the module's own tests run against each one. A mutant is killed
when a test fails (or the run times out), survived when all pass. Prints, per module, one parseable line:

    MUTATION module=<path> killed=<n> survived=<n> score=<killed / (killed + survived)>

and keeps the sessions in var/mutation/<name>.sqlite (`cosmic-ray dump` / `cr-report` show each survivor).
Usage: python scripts/mutation.py [--fresh] [name ...]   (names below; all when none). An interrupted session
(var/mutation/<name>.sqlite) goes on where it stopped, and the line then adds ``not_run=<n>``; --fresh starts
over. Needs Postgres and Redis like `make test` (DATABASE_URL, CELERY_BROKER_URL). Not part of `make test`:
each mutant runs its module's tests once, 150–550 mutants a module, hours for all modules on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "var" / "mutation"
PYTEST = "python -m pytest -x -q -p no:randomly -p no:cacheprovider -n 0 --reuse-db"

# name → (module, the tests that state its rules)
MODULES: dict[str, tuple[str, list[str]]] = {
    "claims": (
        "controlplane/scheduling/claims.py",
        ["tests/scheduling/test_claims.py", "tests/scheduling/test_claim_guards.py", "tests/batches/test_fences.py"],
    ),
    "shards": (
        "controlplane/batches/run/shards.py",
        [
            "tests/batches/test_fences.py",
            "tests/scheduling/test_claim_guards.py",
            "tests/batches/test_dead_letters.py",
            "tests/batches/test_rescue_deadlines.py",
            "tests/batches/test_lifecycle.py",
        ],
    ),
    "finalize": (
        "controlplane/batches/results/finalize.py",
        ["tests/batches/test_fences.py", "tests/batches/test_rescue_deadlines.py", "tests/batches/test_lifecycle.py"],
    ),
    "policy": (
        "controlplane/scheduling/policy.py",
        ["tests/scheduling/test_policy.py", "tests/scheduling/test_policy_properties.py"],
    ),
    "planner": (
        "controlplane/fleet/planner.py",
        [
            "tests/fleet/test_planner_scenarios.py",
            "tests/fleet/test_planner_properties.py",
            "tests/fleet/test_planner_gang_properties.py",
        ],
    ),
    "sizing": (
        "controlplane/fleet/sizing.py",
        ["tests/fleet/test_sizing_properties.py", "tests/fleet/test_size_plans.py"],
    ),
    "custom_ids": ("controlplane/batches/intake/custom_ids.py", ["tests/batches/test_custom_ids.py"]),
    "quickcheck": ("controlplane/batches/intake/quickcheck.py", ["tests/batches/test_quickcheck.py"]),
    "fastparse": ("controlplane/kinds/tensor_fast.py", ["tests/batches/test_fastparse.py"]),
}
# Per mutant: a mutant that makes its tests hang (a loop that never ends) counts as killed at this limit.
TIMEOUT_SECONDS = 600.0


def _scratch_copy() -> Path:
    """The tracked files and the untracked ones git does not ignore, as the working tree has them now."""
    root = Path(tempfile.mkdtemp(prefix="mutation-"))
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = REPO / raw.decode()
        if source.is_file():
            target = root / raw.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (root / ".venv").symlink_to((REPO / ".venv").resolve())
    return root


def _config(module: str, tests: list[str]) -> str:
    return (
        "[cosmic-ray]\n"
        f'module-path = "{module}"\n'
        f"timeout = {TIMEOUT_SECONDS}\n"
        "excluded-modules = []\n"
        f'test-command = ".venv/bin/{PYTEST} {" ".join(tests)}"\n'
        '[cosmic-ray.distributor]\nname = "local"\n'
    )


def run(name: str, *, fresh: bool) -> tuple[int, int, int]:
    """Killed, survived and not yet run. An interrupted session goes on where it stopped unless ``fresh``."""
    module, tests = MODULES[name]
    scratch = _scratch_copy()
    cosmic = str(REPO / ".venv" / "bin" / "cosmic-ray")
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        config, session = scratch / "mutation.toml", OUT / f"{name}.sqlite"
        config.write_text(_config(module, tests))
        if fresh or not session.exists():
            session.unlink(missing_ok=True)
            subprocess.run([cosmic, "init", str(config), str(session)], cwd=scratch, check=True)
            subprocess.run([cosmic, "baseline", str(config)], cwd=scratch, check=True)  # the tests pass unmutated
        subprocess.run([cosmic, "exec", str(config), str(session)], cwd=scratch, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    dump = subprocess.run([cosmic, "dump", str(session)], check=True, capture_output=True, text=True)
    killed = survived = pending = 0
    for line in dump.stdout.splitlines():
        _, result = json.loads(line)
        outcome = (result or {}).get("test_outcome")
        killed += outcome == "killed"
        survived += outcome == "survived"
        pending += result is None
    return killed, survived, pending


def main(args: list[str]) -> int:
    fresh = "--fresh" in args
    names = [a for a in args if a != "--fresh"]
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane")
    for name in names or list(MODULES):
        killed, survived, pending = run(name, fresh=fresh)
        score = killed / (killed + survived) if killed + survived else 0.0
        print(
            f"MUTATION module={MODULES[name][0]} killed={killed} survived={survived} score={score:.2f}"
            + (f" not_run={pending}" if pending else ""),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Mutation testing of the modules that guard correctness (`make mutation`, docs/reliability.md), with cosmic-ray.

Each module's mutants are applied one at a time to a scratch copy of the repository (cosmic-ray edits files in
place; the working tree is never touched), and the module's own tests run against each one. A mutant is killed
when a test fails (or the run times out), survived when all pass. Prints, per module, one parseable line:

    MUTATION module=<path> killed=<n> survived=<n> score=<killed / (killed + survived)>

and keeps the sessions in var/mutation/<name>.sqlite (`cosmic-ray dump` / `cr-report` show each survivor).
Usage: python scripts/mutation.py [--fresh] [--sample N] [name ...]   (names below; all when none). An
interrupted session (var/mutation/<name>.sqlite) goes on where it stopped, and the line then adds
``not_run=<n>``; --fresh starts over. Needs Postgres and Redis like `make test` (DATABASE_URL, CELERY_BROKER_URL).
Not part of `make test`: 80–550 mutants a module, 15–80 min each here.

``--sample N`` (`make mutation`'s default pass) runs N mutants a module, drawn with a seed taken from the module's
source, so a resumed or repeated pass of the same code draws the same mutants; the others are marked skipped in
the session (var/mutation/<name>.sample.sqlite), as cosmic-ray's own filters mark mutants, and the line adds
``sampled=<drawn>/<all>``. Its score estimates the full one (± ~0.1 at 24 mutants); the full sessions
(`make mutation FULL=1`) are the ones docs/reliability.md records ("Mutation testing").

A mutant runs only the tests that can see it, fastest first, stopping at the first failure: one unmutated run
with scripts/mutation_calls.py records which test enters which function of the module (and how long each test
takes); a mutant inside a function body then runs the tests that entered that function, a mutant outside any
function (module or class level, a signature, a decorator: run at import) runs all the module's tests, and a
mutant in a function no test enters runs none and counts as survived.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "var" / "mutation"
# Plugins are named rather than found (PYTEST_DISABLE_PLUGIN_AUTOLOAD): schemathesis' and anyio's cost each run
# seconds of imports on a loaded host, for tests that use neither. xdist stays (tests/plugins/scheduling.py
# implements one of its hooks), with no workers. The test database is created once, by the recording run (--reuse-db).
PYTEST = [".venv/bin/python", "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider"]
PYTEST += ["-p", "xdist", "-p", "timeout"]
# By entry-point name, as autoloading registers them: tests/plugins/__init__.py asks for the plugin named "django".
DJANGO_PLUGIN = ["-p", "django", "--reuse-db"]
HYPOTHESIS_PLUGIN = ["-p", "hypothesispytest"]
# Modules with no Django in them: their tests run without it (tests/plugins/__init__.py allows `-p no:django`), which
# saves the settings, the apps and the test database on every run.
PURE = {"policy", "planner"}  # not sizing: tests/fleet/test_size_plans.py reads the catalogue

# name → (module, the tests that state its rules)
MODULES: dict[str, tuple[str, list[str]]] = {
    "claims": (
        "controlplane/scheduling/claims.py",
        [
            "tests/scheduling/test_claims.py",
            "tests/scheduling/test_settle.py",
            "tests/scheduling/test_claim_guards.py",
            "tests/batches/test_fences.py",
        ],
    ),
    "shards": (
        "controlplane/batches/shards.py",
        [
            "tests/batches/test_fences.py",
            "tests/scheduling/test_claim_guards.py",
            "tests/batches/test_dead_letters.py",
            "tests/batches/test_rescue_deadlines.py",
            "tests/batches/test_lifecycle.py",
            "tests/batches/test_shard_writes.py",
        ],
    ),
    "finalize": (
        "controlplane/batches/results/finalize.py",
        [
            "tests/batches/test_fences.py",
            "tests/batches/test_rescue_deadlines.py",
            "tests/batches/test_lifecycle.py",
            "tests/batches/results/test_finalize_merge.py",
            # The dead shard of a cancelled batch: its lines are internal_error, not batch_cancelled.
            "tests/batches/test_dead_letters.py",
        ],
    ),
    "policy": (
        "controlplane/scheduling/policy.py",
        ["tests/scheduling/test_policy.py", "tests/scheduling/test_policy_properties.py"],
    ),
    "planner": (
        "controlplane/fleet/placement/planner.py",
        [
            "tests/fleet/test_planner_scenarios.py",
            "tests/fleet/test_planner_properties.py",
            "tests/fleet/test_planner_gang_properties.py",
            "tests/fleet/test_planner_consolidation.py",
            "tests/fleet/test_planner_consolidation_properties.py",
        ],
    ),
    "sizing": (
        "controlplane/fleet/sizing/planner.py",
        ["tests/fleet/test_sizing_rules.py", "tests/fleet/test_sizing_properties.py", "tests/fleet/test_size_plans.py"],
    ),
    "custom_ids": ("controlplane/batches/intake/custom_ids.py", ["tests/batches/intake/test_custom_ids.py"]),
    "quickcheck": ("controlplane/batches/intake/quickcheck.py", ["tests/batches/intake/test_quickcheck.py"]),
    "fastparse": ("controlplane/kinds/tensors/fast.py", ["tests/kinds/test_tensors_fastparse.py"]),
}
# Per mutant: a mutant that makes its tests hang (a loop that never ends) counts as killed at this limit. Each
# test also gets pytest-timeout's limit of ten times its unmutated duration (at least a minute: the host is noisy).
TIMEOUT_SECONDS = 600.0
# Files git ignores that tests read: tinylm's tokenizer (written by `make install`) validates a chat batch.
IGNORED_INPUTS = ["triton_models/tinylm/1/hf"]


def _scratch_copy() -> Path:
    """The tracked files and the untracked ones git does not ignore, as the working tree has them now, and the
    ignored inputs the tests need."""
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
    for path in IGNORED_INPUTS:
        if (REPO / path).is_dir() and not (root / path).exists():
            shutil.copytree(REPO / path, root / path)
    (root / ".venv").symlink_to((REPO / ".venv").resolve())
    return root


def _config(name: str, calls: Path) -> str:
    test_command = f".venv/bin/python scripts/mutation.py --run-mutant {name} {calls}"
    return (
        "[cosmic-ray]\n"
        f'module-path = "{MODULES[name][0]}"\n'
        f"timeout = {TIMEOUT_SECONDS}\n"
        "excluded-modules = []\n"
        f'test-command = "{test_command}"\n'
        '[cosmic-ray.distributor]\nname = "local"\n'
    )


def _fingerprint(scratch: Path, name: str) -> str:
    """The module's tests: a recording made for other tests is made again."""
    digest = hashlib.sha256()
    for path in MODULES[name][1]:
        digest.update((scratch / path).read_bytes())
    return digest.hexdigest()


def _sample(session: Path, size: int, seed: str) -> None:
    """Marks all but ``size`` of the session's mutants skipped. The draw orders the mutants by what they change
    (operator, occurrence, place), not by cosmic-ray's job ids, which are new at every init."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        items = sorted(
            db.pending_work_items,
            key=lambda item: [(m.operator_name, m.occurrence, tuple(m.start_pos)) for m in item.mutations],
        )
        drawn = {item.job_id for item in random.Random(seed).sample(items, min(size, len(items)))}
        for item in items:
            if item.job_id not in drawn:
                result = WorkResult(output="not drawn for this sample", worker_outcome=WorkerOutcome.SKIPPED)
                db.set_result(item.job_id, result)


def _survivors_again(session: Path) -> None:
    """The tests changed (a test added for a survivor): survivors run again. Killed mutants stay killed, which
    holds while tests are only added; after a test is removed or weakened, start over with --fresh."""
    with sqlite3.connect(session) as db:
        db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")


def _record_calls(scratch: Path, name: str, calls: Path) -> None:
    """One unmutated run of the module's tests (which must pass) noting which test enters which function."""
    module, tests = MODULES[name]
    env = {**os.environ, "MUTATION_TARGET": str(scratch / module), "MUTATION_CALLS_OUT": str(calls)}
    plugins = [] if name in PURE else DJANGO_PLUGIN
    plugins += HYPOTHESIS_PLUGIN if any("hypothesis" in (scratch / test).read_text() for test in tests) else []
    command = [*PYTEST, *plugins, "-p", "scripts.mutation_calls", *tests]
    if _pytest(command, cwd=scratch, env=env) != 0:
        raise SystemExit(f"{name}: the tests fail unmutated (output above)")
    recorded = json.loads(calls.read_text())
    recorded.update(source=(scratch / module).read_text(), tests_fingerprint=_fingerprint(scratch, name))
    recorded["plugins"] = plugins
    calls.write_text(json.dumps(recorded, indent=1))


def _changed_span(original: bytes, mutated: bytes) -> tuple[tuple[int, int], tuple[int, int]]:
    """(line, byte column) of the start and end in the original of the one stretch the mutant replaced."""
    shorter = min(len(original), len(mutated))
    prefix = 0
    while prefix < shorter and original[prefix] == mutated[prefix]:
        prefix += 1
    suffix = 0
    while suffix < shorter - prefix and original[-1 - suffix] == mutated[-1 - suffix]:
        suffix += 1

    def position(offset: int) -> tuple[int, int]:
        return original.count(b"\n", 0, offset) + 1, offset - (original.rfind(b"\n", 0, offset) + 1)

    return position(prefix), position(len(original) - suffix)


def _in_signature_annotation(tree: ast.Module, span: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    """Whether the stretch lies in a function's parameter or return annotation: under ``from __future__ import
    annotations`` those are strings nothing here evaluates, so a mutant there is equivalent (it survives)."""
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            params = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            for annotation in [node.returns, *(a.annotation for a in params if a is not None)]:
                if annotation is not None:
                    first = (annotation.lineno, annotation.col_offset)
                    last = (annotation.end_lineno or annotation.lineno, annotation.end_col_offset or 0)
                    if first <= span[0] and span[1] <= last:
                        return True
    return False


def _enclosing_functions(tree: ast.Module, lines: set[int]) -> set[int] | None:
    """The first line of the code object of the innermost function whose body holds each line (decorators
    included, as Python counts it), or None when a line is outside every function body (it runs at import)."""
    bodies = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            bodies.append((node.body[0].lineno, node.end_lineno or node.lineno, first))
    found = set()
    for line in lines:
        holding = [body for body in bodies if body[0] <= line <= body[1]]
        if not holding:
            return None
        found.add(max(holding)[2])  # the innermost body starts last
    return found


def run_mutant(name: str, calls: Path) -> int:
    """cosmic-ray's test command, in the scratch copy with the mutant applied: runs the tests that can see it."""
    module, _ = MODULES[name]
    recorded = json.loads(calls.read_text())
    mutated = Path(module).read_bytes()
    try:
        compile(mutated, module, "exec")
    except SyntaxError as error:  # e.g. the bare `*` of keyword-only parameters "replaced" by `+`
        print(f"killed unrun: the mutant does not compile ({error}), so no test can import the module")
        return 1
    tree = ast.parse(recorded["source"])
    span = _changed_span(recorded["source"].encode(), mutated)
    if _in_signature_annotation(tree, span):
        print(f"survived unrun: equivalent, in an annotation at line {span[0][0]} (never evaluated)")
        return 0
    functions = _enclosing_functions(tree, set(range(span[0][0], span[1][0] + 1)))
    timings = recorded["tests"]
    if functions is None:
        selected = sorted(timings, key=lambda nodeid: timings[nodeid]["seconds"])
    else:
        selected = sorted(
            (nodeid for nodeid, test in timings.items() if functions & set(test["code_lines"])),
            key=lambda nodeid: timings[nodeid]["seconds"],
        )
    if not selected:
        print(f"survived unrun: no test enters the function(s) at line(s) {sorted(functions or ())}")
        return 0
    limit = max(60, 10 * max(timings[nodeid]["seconds"] for nodeid in selected))
    return _pytest([*PYTEST, *recorded["plugins"], f"--timeout={limit:.0f}", *selected])


def _pytest(command: list[str], **options: Any) -> int:
    """Run pytest; again (up to twice, after a pause) when Postgres refused a connection for want of slots:
    other suites on this shared host fill max_connections for a while, and that failure says nothing of the
    mutant or the tests."""
    tries = 3
    while True:
        result = subprocess.run(command, capture_output=True, text=True, check=False, **options)
        print(result.stdout + result.stderr, flush=True)
        tries -= 1
        if result.returncode == 0 or tries == 0 or "too many clients already" not in result.stdout + result.stderr:
            return result.returncode
        time.sleep(30)


def run(name: str, *, fresh: bool, sample: int | None) -> tuple[int, int, int, int]:
    """Killed, survived, not yet run, and left out of the sample. An interrupted session goes on where it stopped
    unless ``fresh``."""
    scratch = _scratch_copy()
    cosmic = str(REPO / ".venv" / "bin" / "cosmic-ray")
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        config, calls = scratch / "mutation.toml", OUT / f"{name}.calls.json"
        session = OUT / (f"{name}.sample.sqlite" if sample else f"{name}.sqlite")
        config.write_text(_config(name, calls))
        recorded = json.loads(calls.read_text()) if calls.exists() else {}
        module_changed = recorded.get("source") != (scratch / MODULES[name][0]).read_text()
        if fresh or module_changed or not session.exists():
            session.unlink(missing_ok=True)
            _record_calls(scratch, name, calls)  # also the baseline: the tests pass unmutated
            subprocess.run([cosmic, "init", str(config), str(session)], cwd=scratch, check=True)
            if sample:
                _sample(session, sample, seed=(scratch / MODULES[name][0]).read_text())
        elif recorded.get("tests_fingerprint") != _fingerprint(scratch, name):
            _record_calls(scratch, name, calls)
            _survivors_again(session)
        subprocess.run([cosmic, "exec", str(config), str(session)], cwd=scratch, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    dump = subprocess.run([cosmic, "dump", str(session)], check=True, capture_output=True, text=True)
    killed = survived = pending = skipped = 0
    for line in dump.stdout.splitlines():
        _, result = json.loads(line)
        outcome = (result or {}).get("test_outcome")
        killed += outcome == "killed"
        survived += outcome == "survived"
        pending += result is None
        skipped += (result or {}).get("worker_outcome") == "skipped"
    return killed, survived, pending, skipped


def main(args: list[str]) -> int:
    if args[:1] == ["--run-mutant"]:
        return run_mutant(args[1], Path(args[2]))
    fresh = "--fresh" in args
    sample = int(args[args.index("--sample") + 1]) if "--sample" in args else None
    names = [a for i, a in enumerate(args) if a != "--fresh" and a != "--sample" and args[i - 1 : i] != ["--sample"]]
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    # No bytecode cache (make test writes one): a mutant written within the same second as the source it replaces
    # and of the same size would be run from the other's cached bytecode.
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    for name in names or list(MODULES):
        killed, survived, pending, skipped = run(name, fresh=fresh, sample=sample)
        score = killed / (killed + survived) if killed + survived else 0.0
        total = killed + survived + pending + skipped
        print(
            f"MUTATION module={MODULES[name][0]} killed={killed} survived={survived} score={score:.2f}"
            + (f" not_run={pending}" if pending else "")
            + (f" sampled={total - skipped}/{total}" if sample else ""),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the chaos scenarios share: the profile (short or full), the stack with its killable dependencies,
the invariant check and the recovery measurements, and the table of figures (docs/reliability.md, "Latest figures").

Times: the database stamps shards with the workers' wall clock (same host), so every measured moment here
is `time.time()` as well."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from deploy.local.stack import REPO_ROOT
from tests.chaos.services import ThrowawayPostgres, ThrowawayRedis
from tests.e2e.conftest import E2E
from tests.support.stack import read_jsonl, submit, tensor_lines

FULL = os.environ.get("CHAOS_FULL", "") not in ("", "0")
RESULTS_DIR = Path(os.environ.get("CHAOS_RESULTS_DIR", REPO_ROOT / "var" / "chaos"))

# Targets and the bounds the tests assert: 3× the target, times the host's contention measured in the
# scenario (contention(): ~1 when idle), for a shared, noisy 2-core machine. The measured figures, not the
# bounds, go to docs/reliability.md.
WORKER_RESCUE_TARGET_S = 15.0  # a killed worker's shards run again within
RESUME_TARGET_S = 5.0  # work resumes after the dependency (or, after a Triton restart, the model) is ready
STOP_TARGET_S = 10.0  # cancel/expiry completes while Triton is down (our figure: two rescue ticks + finalize)
MARGIN = 3.0
MODEL = "identity"
# The generation model (triton_models/tinylm), warm on the chaos stack beside MODEL (tests/chaos/generation.py).
GEN_MODEL = "tinylm"
# Batches of different tenants share the slots (fair share); one tenant's batches run oldest first.
TENANTS = ("a", "b", "c")
TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True)
class Profile:
    name: str
    worker_kills: int
    triton_down_s: float
    triton_pause_s: float
    broker_down_s: float
    # Lines per batch: enough that a batch still has work when a fault ends (shards of 50 lines here).
    lines: int
    # Lines per generation batch (tinylm, up to 40 tokens each): many shards, so work is left after a fault
    # that lands on one. A warm engine now decodes a 50-line shard in ~0.2 s (240 lines ended in 0.6 s, before
    # the kill), so a batch lasts a few seconds.
    gen_lines: int = 1200


SHORT = Profile("short", worker_kills=3, triton_down_s=10, triton_pause_s=10, broker_down_s=5, lines=3000)
FULL_PROFILE = Profile(
    "full", worker_kills=20, triton_down_s=90, triton_pause_s=60, broker_down_s=30, lines=6000, gen_lines=3000
)
PROFILE = FULL_PROFILE if FULL else SHORT


# A fixed amount of CPU work, timed on the wall clock in a child process (contention()).
_CONTENTION_PROBE = """
import time
wall, cpu = time.perf_counter(), time.process_time()
x = 0
while time.process_time() - cpu < {cpu_s}:
    x += 1
print((time.perf_counter() - wall) / (time.process_time() - cpu))
"""


def contention(cpu_s: float = 0.1) -> float:
    """How many ways the cores are shared right now: wall-clock time over CPU time of a fixed CPU-bound loop in a
    child process (~1 on an idle host; ~N when N runnable processes share each core). Recovery bounds scale with
    it (Figures.bound_s), so a time limit is a ratio to the speed this host has during the test, not a constant."""
    out = subprocess.run(
        [sys.executable, "-c", _CONTENTION_PROBE.format(cpu_s=cpu_s)], capture_output=True, text=True, timeout=120
    )
    return max(1.0, float(out.stdout.strip()))


@dataclass
class Figures:
    """One row of the reliability table."""

    scenario: str
    lines: int = 0
    lost: int = 0
    duplicated: int = 0
    failed: int = 0
    recovery_s: float | None = None
    target_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    contention: float = 1.0  # the largest contention() sampled around the fault (sample_contention)

    def sample_contention(self) -> None:
        """Call before the fault and after recovery: the bound takes the worse of the samples."""
        self.contention = max(self.contention, round(contention(), 2))

    def bound_s(self, target_s: float | None = None) -> float:
        """The asserted bound: MARGIN x the target, times the contention measured in this scenario."""
        target = self.target_s if target_s is None else target_s
        assert target is not None, f"{self.scenario}: no target"
        return target * MARGIN * self.contention


class Recorder:
    """Collects each scenario's figures; written after every scenario so a failed run keeps the others."""

    def __init__(self, profile: Profile, directory: Path = RESULTS_DIR) -> None:
        self.profile = profile
        self.rows: list[Figures] = []
        self.json_path = directory / f"results-{profile.name}.json"
        self.md_path = directory / f"results-{profile.name}.md"

    def add(self, figures: Figures) -> None:
        self.rows = [r for r in self.rows if r.scenario != figures.scenario] + [figures]
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"profile": asdict(self.profile), "at": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
        payload["rows"] = [asdict(r) for r in self.rows]
        self.json_path.write_text(json.dumps(payload, indent=2, default=str))
        self.md_path.write_text(self.markdown())

    def markdown(self) -> str:
        out = [
            f"Profile `{self.profile.name}`: {self.profile}",
            "",
            "| scenario | lines | lost | duplicated | failed | recovery s | target s | contention |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            rec = "–" if r.recovery_s is None else f"{r.recovery_s:.1f}"
            tgt = "–" if r.target_s is None else f"{r.target_s:g}"
            out.append(
                f"| {r.scenario} | {r.lines} | {r.lost} | {r.duplicated} | {r.failed} | {rec} | {tgt} | {r.contention:g} |"
            )
        out += ["", "Details:", ""]
        out += [f"- {r.scenario}: {json.dumps(r.details, default=str)}" for r in self.rows]
        return "\n".join(out) + "\n"


class Chaos(E2E):
    """The e2e view of a stack (SDK, SQL) plus its own killable Postgres, Redis and Triton."""

    def __init__(self, stack, db_url: str, keys: dict[str, str], pg: ThrowawayPostgres, broker: ThrowawayRedis) -> None:
        super().__init__(stack, db_url, keys[TENANTS[0]])
        self.pg = pg
        self.broker = broker
        self.clients = {tenant: self.sdk(key) for tenant, key in keys.items()}
        self.client = self.clients[TENANTS[0]]
        self.owners: dict[str, str] = {}  # batch id -> tenant

    # --- reading state, through faults --------------------------------------------------------------
    def sql(self, query: str, *params: object) -> list[tuple]:
        """Like E2E.sql, but rides out a restarting database (the test observes, it must not fail)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.db_url, autocommit=True, connect_timeout=2)
                return self._conn.execute(query, params).fetchall()
            except psycopg.OperationalError:  # the database restarted under the open connection, or is down
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def status(self, batch_id: str) -> str:
        return self.sql("SELECT status FROM batches_batch WHERE id=%s", batch_id)[0][0]

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(poll_s)
        raise AssertionError(f"{what}: not within {timeout_s:g}s (logs: {self.stack.log_dir})")

    def wait_terminal(self, batch_ids: Iterable[str], timeout_s: float = 300) -> None:
        ids = list(batch_ids)

        def done() -> bool:
            rows = self.sql(
                "SELECT count(*) FROM batches_batch WHERE id = ANY(%s) AND status = ANY(%s)", ids, list(TERMINAL)
            )
            return rows[0][0] == len(ids)

        self.wait_for(f"batches {ids} terminal", done, timeout_s, poll_s=0.25)

    def succeeded_shards(self, batch_id: str) -> int:
        return self.sql("SELECT count(*) FROM batches_shard WHERE batch_id=%s AND status='succeeded'", batch_id)[0][0]

    def wait_progress(self, batch_id: str, shards: int = 2, timeout_s: float = 60) -> None:
        """Until the batch has committed `shards` shards: the fault hits a batch that is really running."""
        self.wait_for(f"{batch_id}: {shards} shards done", lambda: self.succeeded_shards(batch_id) >= shards, timeout_s)

    def commits_since(self, since: float, *, claimed_since: bool = True) -> list[float]:
        """Commit times (epoch s) of shards claimed at or after `since` (or, with ``claimed_since`` False, of any
        shard committed at or after it), of any batch, in order."""
        column = "started_at" if claimed_since else "finished_at"
        rows = self.sql(
            "SELECT extract(epoch FROM finished_at)::float8 FROM batches_shard WHERE status IN ('succeeded','stopped') "
            f"AND {column} >= to_timestamp(%s) ORDER BY finished_at",
            since,
        )
        return [r[0] for r in rows]

    def resumed(
        self, ready_at: float, batch_ids: list[str], timeout_s: float, *, claimed_since: bool = True
    ) -> dict[str, float]:
        """Work resumes after a dependency is ready at `ready_at`: `resume_s` until the first shard claimed
        after that commits, and `max_gap_s` the longest pause between commits from then until the batches
        end (a resume that stalls again later, e.g. on lost broker messages, shows there). Waits for the
        first commit up to `timeout_s`, then for the batches to end. ``claimed_since`` False counts any shard
        committed after `ready_at`: a pause's frozen shards finish on the attempt they had, and when they were
        the batch's last, no shard is claimed after it."""
        what = "a shard claimed after recovery commits" if claimed_since else "a shard commits after recovery"
        self.wait_for(what, lambda: self.commits_since(ready_at, claimed_since=claimed_since), timeout_s)
        self.wait_terminal(batch_ids)
        commits = self.commits_since(ready_at, claimed_since=claimed_since)
        stamps = [ready_at, *commits]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        return {"resume_s": round(commits[0] - ready_at, 2), "max_gap_s": round(max(gaps), 2)}

    def model_ready(self, model: str = MODEL) -> bool:
        """Triton reports the model ready (it may still be missing from the control plane's placements)."""
        try:
            with urllib.request.urlopen(f"{self.stack.triton_http_url}/v2/models/{model}/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def routable(self, model: str = MODEL) -> bool:
        """The control plane would route a call of the model now (a ready placement, breaker closed)."""
        rows = self.sql(
            "SELECT count(*) FROM fleet_placement p JOIN fleet_cataloguemodel m ON m.id=p.model_id "
            "JOIN fleet_tritonserver s ON s.id=p.server_id WHERE m.triton_name=%s AND p.status='ready' "
            "AND p.instances > 0 AND s.state IN ('healthy','cordoned') "
            "AND (s.breaker_open_until IS NULL OR s.breaker_open_until <= now())",
            model,
        )
        return rows[0][0] > 0

    # --- driving it ----------------------------------------------------------------------------------
    def submit(self, lines: list[dict], *, window: str = "24h", tenant: str = TENANTS[0], endpoint: str = "/v2/infer"):
        batch = submit(self.clients[tenant], lines, endpoint=endpoint, window=window)
        self.owners[batch.id] = tenant
        return batch

    def identity_lines(self, prefix: str, n: int | None = None) -> list[dict]:
        return tensor_lines(n or PROFILE.lines, prefix=prefix, model=MODEL)

    def triton_restart_if_exited(self) -> bool:
        """After SIGCONT: Triton's python backend sometimes aborts just after a resume (a
        ``boost::interprocess::lock_exception`` once it finds a stub "not healthy" after the pause; the stack's
        Triton holds tinylm's stub whatever the scenario). Then the server is started again, as an orchestrator
        does, and True is returned: the scenario counts its resume from the models being ready, as after a kill."""
        if self.stack.procs["triton"].poll() is None:
            return False
        self.stack.procs.pop("triton")
        self.stack.restart_triton()
        self.ensure_serving()
        return True

    def routable_or_restarted(self, timeout_s: float = 120) -> bool:
        """Wait until the model is routable again after SIGCONT; whether Triton aborted on the resume (and was
        started again). A Triton that is still up but never routable again fails the scenario."""
        deadline = time.monotonic() + timeout_s
        while not self.routable():
            if self.triton_restart_if_exited():
                return True
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"routable again: not within {timeout_s:g}s, Triton up (logs: {self.stack.log_dir})"
                )
            time.sleep(0.1)
        return False

    def ensure_serving(self, timeout_s: float = 120) -> None:
        """The stack's Triton serves the warm models and the control plane routes to them again."""
        for model in (MODEL, GEN_MODEL):
            ready = lambda m=model: self.model_ready(m) and self.routable(m)  # noqa: E731
            self.wait_for(f"{model} routable", ready, timeout_s, poll_s=0.25)

    def heal(self) -> None:
        """Undo whatever a failed scenario left behind: every dependency and process running, the model
        routable. A passing scenario leaves nothing to do here."""
        if not self.pg.running():
            self.pg.start()
        if self.broker.proc is None or self.broker.proc.poll() is not None:
            self.broker.start()
        triton = self.stack.procs.get("triton")
        if triton is not None and triton.poll() is None:
            self.stack.signal("triton", signal.SIGCONT)
        else:
            self.stack.procs.pop("triton", None)
            self.stack.restart_triton()
        if "worker" not in self.stack.procs or self.stack.procs["worker"].poll() is not None:
            self.stack.procs.pop("worker", None)
            self.stack.start_worker()
        self.ensure_serving()
        # A scenario may hold its tenants' batches (paused) for a while.
        self.sql("UPDATE tenants_tenant SET paused=false WHERE paused RETURNING id")
        # A failed scenario's batches would hold the slots the next one's need (its 2 shards in 60 s). Straight to
        # the stack: a scenario's client may have gone through a proxy that is gone now.
        for key in {client.api_key for client in self.clients.values()}:
            client = self.sdk(key)
            for batch in client.batches.list(limit=100):
                if batch.status in ("validating", "in_progress"):
                    client.batches.cancel(batch.id)

    def rescue_seconds(self, shard_id: int, attempt: int, killed_at: float) -> float:
        """Seconds from a worker's kill to its orphan's next claim, after checking that its own lease expiry
        (not a release or a commit) handed it back."""

        def next_claim():
            return self.sql(
                "SELECT extract(epoch FROM e.created_at)::float8 FROM batches_batchevent e "
                "JOIN batches_shard s ON s.batch_id=e.batch_id AND s.index=e.shard_index "
                "WHERE s.id=%s AND e.kind='shard_claimed' AND e.message LIKE %s",
                shard_id,
                f"attempt {attempt + 1} by %",
            )

        (claimed_at,) = self.wait_for(
            f"shard {shard_id} claimed again after attempt {attempt}", next_claim, WORKER_RESCUE_TARGET_S * MARGIN * 2
        )[0]
        rescued = self.sql(
            "SELECT count(*) FROM batches_batchevent e JOIN batches_shard s ON s.batch_id=e.batch_id "
            "AND s.index=e.shard_index WHERE s.id=%s AND e.kind='shard_rescued_pending' AND e.message LIKE %s",
            shard_id,
            f"lease of attempt {attempt} expired%",
        )[0][0]
        assert rescued == 1, f"shard {shard_id}: attempt {attempt} did not come back through its expired lease"
        return round(claimed_at - killed_at, 2)

    # --- the invariant -------------------------------------------------------------------------------
    def tally(
        self, figures: Figures, batch_id: str, lines: list[dict], *, allowed_error_codes: Iterable[str] = ()
    ) -> tuple[list[dict], list[dict]]:
        """Add one finished batch to the row's counts and check the invariant: every custom_id in exactly
        one of the output and error files, request_counts equal to their line counts, no error lines but
        the allowed codes (cancel/expiry)."""
        client = self.clients[self.owners[batch_id]]
        batch = client.batches.retrieve(batch_id)
        output, errors = read_jsonl(client, batch.output_file_id), read_jsonl(client, batch.error_file_id)
        seen = [r["custom_id"] for r in output] + [r["custom_id"] for r in errors]
        expected = {line["custom_id"] for line in lines}
        allowed = set(allowed_error_codes)
        figures.lines += len(lines)
        figures.lost += len(expected - set(seen))
        figures.duplicated += len(seen) - len(set(seen))
        unexpected = [e for e in errors if (e.get("error") or {}).get("code") not in allowed]
        figures.failed += len(unexpected)
        figures.details.setdefault("batches", []).append(
            {"id": batch_id, "status": batch.status, "completed": len(output), "errors": len(errors)}
        )
        assert set(seen) <= expected, f"{batch_id}: unknown custom_ids in the results"
        assert batch.request_counts.total == len(lines), f"{batch_id}: request_counts.total"
        assert batch.request_counts.completed == len(output), f"{batch_id}: request_counts.completed"
        assert batch.request_counts.failed == len(errors), f"{batch_id}: request_counts.failed"
        return output, errors

    def assert_clean(self, figures: Figures) -> None:
        assert figures.lost == 0, f"{figures.scenario}: {figures.lost} lines lost"
        assert figures.duplicated == 0, f"{figures.scenario}: {figures.duplicated} lines duplicated"
        assert figures.failed == 0, f"{figures.scenario}: {figures.failed} lines failed"

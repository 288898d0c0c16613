"""The fleet follows the work, with real processes.

The local runner in orchestrator mode (deploy/local/orchestrator.py) starts with one tritonserver and
follows `batch_fleet_desired_servers{pool="default"}` from the control plane's /metrics, as KEDA would.
A flood of the `sleep_per_row` model (a fixed time per row, like a GPU-bound model, so capacity grows with
servers on this 2-core host) cannot drain within the planned horizon (FLEET_DRAIN_HORIZON_SECONDS) on one
server: servers must be added, register
(`fleet_register`), receive placements and serve shards until the backlog drains; once the flood is over
they must be drained (`fleet_drain`) and stopped, back to one. No line may fail.

Short form in `make test`; `make scale` runs the full form (SCALE_FULL=1: a larger flood, up to four
servers). Timings go to var/scale/results-<profile>.json and the terminal.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
import pytest
import redis

from deploy.local.databases import migrated_database
from deploy.local.stack import REPO_ROOT, Stack, find_free_port
from tests.e2e.conftest import broker_env
from tests.support.stack import assert_exactly_once, register_sleeping_model, submit, tensor_lines
from tests.support.stack_tenants import tenant_key

pytestmark = [pytest.mark.e2e, pytest.mark.scale]

BROKER_URL = os.environ.get("SCALE_BROKER_URL", "redis://127.0.0.1:6379/5")
RESULTS_DIR = REPO_ROOT / "var" / "scale"
MODEL = "sleep-per-row"
TRITON_MODEL = "sleep_per_row"


@dataclass(frozen=True)
class Profile:
    name: str
    lines: int
    rows_per_line: int
    window: str  # the batch's completion window
    window_s: float
    max_servers: int


# The short form (in `make test`) gives its batch the 24 h window: the fleet grows because one server cannot
# drain the backlog within the 20 s drain horizon, and no deadline can expire the batch while the host is loaded
# by the rest of the suite (a 40 s window did, at 47.6 s and again at 532/600 lines on clean-clone runs). The
# full form (`make scale`, on a quiet host) keeps a window shorter than one server needs, so the deadline path
# of the size plan runs with real processes there.
DRAIN_HORIZON_S = 20.0
PROFILE = (
    Profile("full", lines=1500, rows_per_line=4, window="90s", window_s=90, max_servers=4)
    if os.environ.get("SCALE_FULL") == "1"
    else Profile("short", lines=600, rows_per_line=4, window="24h", window_s=24 * 3600, max_servers=3)
)


def seconds_per_row() -> float:
    """The model's cost per row, from its config.pbtxt (the one source of truth)."""
    from controlplane.triton.client import repository_model_config

    config = repository_model_config(REPO_ROOT / "triton_models", TRITON_MODEL)
    return float(config["parameters"]["seconds_per_row"]["string_value"])


# One instance fills a server's declared 16 GiB GPU (12 GiB each), so a server is one instance, as a GPU-bound
# model is one per card.
INSTANCE_BYTES = 12 * 1024**3


@dataclass
class Scaled:
    stack: Stack
    db_url: str
    api_key: str

    def sql(self, query: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


@pytest.fixture(scope="module")
def scaled(tmp_path_factory) -> Iterator[Scaled]:
    with migrated_database("cp_scale") as db_url:
        yield from _scaled_stack(tmp_path_factory, db_url)


def _scaled_stack(tmp_path_factory, db_url: str) -> Iterator[Scaled]:
    env = {
        "DATABASE_URL": db_url,
        **broker_env(BROKER_URL),
        "BATCH_COMPLETION_WINDOWS": "24h" if PROFILE.window == "24h" else f"24h,{PROFILE.window}",
        "RESCUE_INTERVAL_SECONDS": "1",
        # The placement loop, quick as in the placement scenario.
        "FLEET_RECONCILE_INTERVAL_SECONDS": "2",
        "FLEET_HEARTBEAT_INTERVAL_SECONDS": "1",
        "FLEET_IDLE_TTL_SECONDS": "6",
        "FLEET_PAYBACK_HORIZON_SECONDS": "20",
        # The size loop, scaled down from minutes to seconds: plan every second, a local server serves
        # within ~10 s of its start, backlog without a deadline drains within 20 s, scale-down after 5 s.
        "FLEET_POOLS": f"default=1:{PROFILE.max_servers}",
        "FLEET_SIZE_INTERVAL_SECONDS": "1",
        "FLEET_STARTUP_SECONDS": "10",
        "FLEET_DRAIN_HORIZON_SECONDS": str(DRAIN_HORIZON_S),
        "FLEET_SCALE_DOWN_COOLDOWN_SECONDS": "5",
        # The orchestrator: one server to start with, the pool's max, a short scale-in window.
        "ORCHESTRATOR_MIN_SERVERS": "1",
        "ORCHESTRATOR_MAX_SERVERS": str(PROFILE.max_servers),
        "ORCHESTRATOR_INTERVAL_SECONDS": "1",
        "ORCHESTRATOR_SCALE_IN_WINDOW_SECONDS": "3",
        "ORCHESTRATOR_DRAIN_TIMEOUT_SECONDS": "30",
    }
    stack = Stack(
        var_dir=Path(tmp_path_factory.mktemp("scale")),
        web_port=find_free_port(),
        env=env,
        with_triton=False,
        orchestrate=True,
        warm_models=(),
        # Six shards at once: enough to keep four one-instance servers busy (two calls in flight each).
        worker_concurrency=6,
    )
    try:
        stack.start()
        register_sleeping_model(stack, name=MODEL, triton=TRITON_MODEL, memory_bytes=INSTANCE_BYTES, max_instances=8)
        key = tenant_key(db_url, "scale-tenant")
        yield Scaled(stack, db_url, key)
    finally:
        stack.stop()


class Watcher(threading.Thread):
    """Every 0.5 s: servers the orchestrator runs, and which of them hold a ready placement of the model."""

    def __init__(self, scaled: Scaled):
        super().__init__(daemon=True)
        self.scaled = scaled
        self.samples: list[tuple[float, dict[str, int], set[str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        orchestrator = self.scaled.stack.orchestrator
        assert orchestrator is not None
        while not self.stop.is_set():
            rows = self.scaled.sql(
                "SELECT s.name FROM fleet_placement p JOIN fleet_tritonserver s ON s.id=p.server_id "
                "JOIN fleet_cataloguemodel m ON m.id=p.model_id WHERE m.triton_name=%s AND p.status='ready' "
                "AND p.instances > 0",
                TRITON_MODEL,
            )
            self.samples.append((time.monotonic(), orchestrator.counts(), {r[0] for r in rows}))
            self.stop.wait(0.5)


def _wait(predicate, timeout_s: float, what: str, log_dir: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout_s:.0f} s (logs: {log_dir})")


def test_servers_follow_a_flood_out_and_back_in(scaled):
    from openai import OpenAI

    stack = scaled.stack
    orchestrator = stack.orchestrator
    assert orchestrator is not None
    _wait(lambda: orchestrator.counts()["serving"] == 1, 90, "the first server", stack.log_dir)
    first = set(orchestrator.servers)
    rows = PROFILE.lines * PROFILE.rows_per_line
    one_server_s = rows * seconds_per_row()
    assert one_server_s > min(PROFILE.window_s, DRAIN_HORIZON_S), "one server must not be enough for the flood"

    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=scaled.api_key, max_retries=0, timeout=60)
    lines = tensor_lines(PROFILE.lines, prefix="flood", model=MODEL, rows=PROFILE.rows_per_line)
    watcher = Watcher(scaled)
    watcher.start()
    try:
        t0, t0_wall = time.monotonic(), time.time()
        batch_id = submit(client, lines, endpoint="/v2/infer", window=PROFILE.window).id
        # A guard against a hang, not a speed claim: one server alone would take one_server_s.
        deadline = time.monotonic() + min(PROFILE.window_s, 4 * one_server_s) + 60
        while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "expired"):
            assert time.monotonic() < deadline, f"batch still {batch.status} (logs: {stack.log_dir})"
            time.sleep(0.5)
        done = time.monotonic()
        # The flood is over: the extra servers must drain and go, back to the floor of one.
        _wait(
            lambda: orchestrator.counts() == {"starting": 0, "serving": 1, "draining": 0},
            120,
            "scale-in",
            stack.log_dir,
        )
        time.sleep(1.0)  # one more sample after the scale-in
    finally:
        watcher.stop.set()
        watcher.join()

    assert batch.status == "completed", (batch.status, batch.request_counts, stack.log_dir)
    assert batch.request_counts.failed == 0 and batch.request_counts.completed == PROFILE.lines
    assert_exactly_once(client, batch, lines)

    events = orchestrator.events
    added = [e for e in events if e.kind == "registered" and e.server not in first and e.at >= t0]
    stopped = [e for e in events if e.kind == "stopped" and e.at >= t0]
    new = {e.server for e in added}
    assert added, f"no server was added (events: {events})"
    peak = max(c["serving"] + c["starting"] for _, c, _ in watcher.samples)
    placed_new = {name for _, _, placed in watcher.samples for name in placed if name in new}
    assert placed_new, f"no added server got a ready placement of {TRITON_MODEL} ({watcher.samples[-5:]})"
    # Every added server was drained before it was stopped, and deregistered.
    assert {e.server for e in stopped} == new, (new, stopped)
    for name in new:
        kinds = [e.kind for e in events if e.server == name]
        assert kinds.index("drained") < kinds.index("stopped"), kinds
    left = {r[0] for r in scaled.sql("SELECT name FROM fleet_tritonserver")}
    assert left == first, f"registered after scale-in: {left}"
    # Servers added by the orchestrator served shards of the flood (a shard names the servers its calls went
    # to, comma-separated, or their addresses when the service runs unmanaged).
    served = scaled.sql(
        "SELECT triton_server, min(finished_at), max(finished_at), count(*) FROM batches_shard "
        "WHERE status='succeeded' GROUP BY triton_server"
    )
    added_names = new | {e.detail for e in added}
    by_new = [r for r in served if set(r[0].split(",")) & added_names]
    assert by_new, f"no shard ran on an added server: {served}"

    last_line_wall = max(r[2] for r in served).timestamp()
    results = {
        "profile": asdict(PROFILE),
        "rows": rows,
        "one_server_s": round(one_server_s, 1),
        "servers_peak": peak,
        "first_server_added_s": round(added[0].at - t0, 1),
        "first_line_on_added_server_s": round(min(r[1] for r in by_new).timestamp() - t0_wall, 1),
        "backlog_drained_s": round(done - t0, 1),
        "last_line_s": round(last_line_wall - t0_wall, 1),
        "extra_servers_removed_s": round(max(e.at for e in stopped) - t0, 1),
        # From the last line served to the last extra server stopped; negative when the fleet already shrank
        # while the tail of the backlog ran on the servers that stay (the need falls with the backlog).
        "scale_in_s": round(max(e.at for e in stopped) - t0 - (last_line_wall - t0_wall), 1),
        "shards_by_server": {r[0]: r[3] for r in served},
        "failed_lines": batch.request_counts.failed,
        "decisions": [f"{e.at - t0:+.1f}s {e.kind} {e.server} {e.detail}".strip() for e in events],
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"results-{PROFILE.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"\nAUTOSCALE profile={PROFILE.name} rows={rows} one_server_s={one_server_s:.0f} "
        f"window_s={PROFILE.window_s:.0f} servers_peak={peak} first_server_added_s={results['first_server_added_s']} "
        f"first_line_on_added_server_s={results['first_line_on_added_server_s']} "
        f"backlog_drained_s={results['backlog_drained_s']} extra_servers_removed_s={results['extra_servers_removed_s']} "
        f"scale_in_s={results['scale_in_s']} failed=0"
    )
    # The order of events, not a wall-clock window (on a loaded 2-core host the window's figure moves with
    # the load, as the drain time of 47.6 s against a 40 s window did once): a server was added and served a line
    # before the backlog drained and before the extra servers went. Which of those two comes first is not fixed:
    # the need falls with the backlog, so the fleet may shrink while the tail runs on the server that stays (each
    # added server drained before it stopped, and no line failed: asserted above); beside a CPU hog it did, 3 s
    # before the batch completed (2026-12-02). The times are reported above and in results-*.json.
    order = ["first_server_added_s", "first_line_on_added_server_s"]
    ends = ["backlog_drained_s", "extra_servers_removed_s"]
    times = {name: results[name] for name in order + ends}
    assert all(t is not None for t in times.values()), times
    assert times[order[0]] <= times[order[1]] <= min(times[end] for end in ends), times


def test_the_management_commands_register_and_drain_a_server(scaled):
    """The orchestrator's other way in (ORCHESTRATOR_FLEET_API=manage): `fleet_register` / `fleet_drain`."""
    from deploy.local.orchestrator_io import LocalTritonLauncher, ManageFleetControl

    stack = scaled.stack
    launcher = LocalTritonLauncher(stack.log_dir)
    fleet = ManageFleetControl(stack.manage, pool="default", gpu_memory_gib=8)
    server = launcher.spawn("by-manage-1")
    try:
        launcher.wait_ready(server)
        fleet.register(server)
        row = scaled.sql(
            "SELECT s.pool, s.http_url, s.metrics_url, g.total_memory_bytes FROM fleet_tritonserver s "
            "JOIN fleet_gpu g ON g.server_id=s.id WHERE s.name=%s",
            server.name,
        )
        assert row == [("default", server.http_url, server.metrics_url, 8 * 1024**3)]
        assert fleet.drain(server.name, timeout_s=30)
        assert scaled.sql("SELECT 1 FROM fleet_tritonserver WHERE name=%s", server.name) == []
    finally:
        launcher.stop(server)
    assert not launcher.alive(server)


def test_a_server_that_dies_is_replaced_and_deregistered(scaled):
    """A tritonserver killed under the orchestrator (a node lost): it is replaced on a later tick and its
    row leaves the fleet once the heartbeat and the reconciler have emptied it."""
    import signal

    stack = scaled.stack
    orchestrator = stack.orchestrator
    assert orchestrator is not None
    _wait(
        lambda: orchestrator.counts() == {"starting": 0, "serving": 1, "draining": 0}, 60, "one server", stack.log_dir
    )
    (victim,) = orchestrator.servers.values()
    assert victim.server.proc is not None
    os.killpg(victim.server.proc.pid, signal.SIGKILL)
    name = victim.server.name
    _wait(
        lambda: (
            any(e.kind == "lost" and e.server == name for e in orchestrator.events)
            and orchestrator.counts()["serving"] == 1
            and name not in orchestrator.servers
        ),
        60,
        "a replacement",
        stack.log_dir,
    )
    (replacement,) = orchestrator.servers
    _wait(
        lambda: {r[0] for r in scaled.sql("SELECT name FROM fleet_tritonserver")} == {replacement},
        60,
        f"{name} deregistered",
        stack.log_dir,
    )

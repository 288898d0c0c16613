"""The local orchestrator's decisions (deploy/local/scale_policy.py) and its loop (deploy/local/orchestrator.py)
with fakes for the gauge, the fleet commands and the server processes. The real counterparts (the /metrics
gauge, fleet_register / fleet_drain, tritonserver processes) run in tests/e2e/test_autoscale.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from deploy.local.orchestrator import Orchestrator
from deploy.local.orchestrator_io import LocalServer, desired_from_text
from deploy.local.scale_policy import Bounds, Observation, decide

WINDOW = 30.0
WIDE = Bounds(0, 4)
ONE_TO_THREE = Bounds(1, 3)


def _decide(desired, serving=("a", "b"), starting=0, bounds=WIDE, history=(), now=100.0, fixed=0):
    readings = [*history, Observation(now, desired)]
    return decide(
        history=readings,
        now=now,
        serving=list(serving),
        starting=starting,
        bounds=bounds,
        scale_in_window_s=WINDOW,
        fixed_servers=fixed,
    )


def test_scale_out_starts_the_difference_at_once():
    decision = _decide(4, history=[Observation(99.0, 2)])
    assert (decision.start, decision.drain, decision.target) == (2, (), 4)


def test_starting_servers_count_as_up():
    assert _decide(3, serving=("a",), starting=2).changes is False


def test_scale_in_drains_newest_first_once_the_window_agrees():
    # serving is oldest first: "b" is the newest and goes first.
    decision = _decide(1, history=[Observation(50.0, 2)])  # the reading of 2 is older than the window
    assert decision.drain == ("b",) and decision.start == 0


def test_scale_in_waits_for_the_peak_of_the_window():
    held = _decide(0, history=[Observation(80.0, 2)])
    assert held.changes is False and "window peak 2" in held.reason
    partly = _decide(0, serving=("a", "b", "c"), history=[Observation(80.0, 2)])
    assert partly.drain == ("c",)


def test_bounds_clamp_both_ways():
    assert _decide(9, bounds=Bounds(0, 3)).start == 1
    assert "bounded to [0, 3]" in _decide(9, bounds=Bounds(0, 3)).reason
    assert _decide(0, serving=("a",), bounds=Bounds(1, 3)).changes is False
    assert _decide(0, serving=(), bounds=Bounds(1, 3)).start == 1


def test_unreadable_gauge_holds_but_keeps_the_bounds():
    assert _decide(None).changes is False
    assert _decide(None, serving=()).reason.startswith("gauge unreadable: holding")
    assert _decide(None, serving=(), bounds=Bounds(2, 4)).start == 2
    assert _decide(None, serving=("a", "b", "c"), bounds=Bounds(0, 2)).drain == ("c",)


def test_fixed_servers_are_subtracted_from_the_pool_gauge():
    # The runner's own Triton is one of the three servers the pool should have.
    assert _decide(3, serving=("a",), fixed=1).start == 1
    assert _decide(1, history=[Observation(50.0, 1)], fixed=1).drain == ("b", "a")


def test_too_many_but_only_starting_waits():
    decision = _decide(0, serving=(), starting=2, history=[Observation(50.0, 0)])
    assert decision.changes is False and "waiting for starting servers" in decision.reason


def test_bounds_reject_nonsense():
    with pytest.raises(ValueError):
        Bounds(3, 2)


def test_desired_from_prometheus_text():
    text = (
        "# HELP batch_fleet_desired_servers Desired Triton servers per pool.\n"
        "# TYPE batch_fleet_desired_servers gauge\n"
        'batch_fleet_desired_servers{pool="default"} 3.0\n'
        'batch_fleet_desired_servers{pool="a100"} 0.0\n'
        "# TYPE batch_shards_runnable gauge\n"
        'batch_shards_runnable{model="identity",priority="normal"} 4.0\n'
    )
    assert desired_from_text(text, "default") == 3
    assert desired_from_text(text, "a100") == 0
    assert desired_from_text(text, "h200") is None
    assert desired_from_text("", "default") is None


# --- the loop, with fakes ---------------------------------------------------------------------------------


@dataclass
class FakeGauge:
    value: int | None = 1

    def desired_servers(self) -> int | None:
        return self.value


@dataclass
class FakeFleet:
    registered: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    # Drain calls that time out (return False) before one succeeds, per server.
    timeouts: dict[str, int] = field(default_factory=dict)
    fail_register: set[str] = field(default_factory=set)

    def register(self, server: LocalServer) -> None:
        if server.name in self.fail_register:
            raise RuntimeError("manage.py fleet_register failed")
        self.registered.append(server.name)

    def drain(self, name: str, timeout_s: float) -> bool:
        if self.timeouts.get(name, 0) > 0:
            self.timeouts[name] -= 1
            return False
        self.drained.append(name)
        return True


@dataclass
class FakeLauncher:
    running: set[str] = field(default_factory=set)
    stopped: list[str] = field(default_factory=list)

    def spawn(self, name: str) -> LocalServer:
        self.running.add(name)
        return LocalServer(name, f"http://{name}", f"{name}:1", f"http://{name}/metrics")

    def wait_ready(self, server: LocalServer) -> None:
        pass

    def alive(self, server: LocalServer) -> bool:
        return server.name in self.running

    def stop(self, server: LocalServer) -> None:
        self.running.discard(server.name)
        self.stopped.append(server.name)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _orchestrator(gauge, fleet=None, launcher=None, bounds=ONE_TO_THREE):
    clock = Clock()
    orch = Orchestrator(
        gauge=gauge,
        fleet=fleet or FakeFleet(),
        launcher=launcher or FakeLauncher(),
        bounds=bounds,
        scale_in_window_s=10.0,
        drain_timeout_s=1.0,
        clock=clock,
        background=False,
    )
    return orch, clock


def test_loop_follows_the_gauge_out_and_in():
    gauge, fleet, launcher = FakeGauge(1), FakeFleet(), FakeLauncher()
    orch, clock = _orchestrator(gauge, fleet, launcher)
    orch.tick()
    assert fleet.registered == ["orch-1"] and orch.counts()["serving"] == 1
    gauge.value = 5  # above max_servers
    clock.now = 2
    orch.tick()
    assert fleet.registered == ["orch-1", "orch-2", "orch-3"] and orch.counts()["serving"] == 3
    gauge.value = 1
    clock.now = 4
    assert orch.tick().changes is False  # the window still remembers 5
    clock.now = 13
    decision = orch.tick()
    assert decision.drain == ("orch-3", "orch-2")
    assert fleet.drained == ["orch-3", "orch-2"] and launcher.stopped == ["orch-3", "orch-2"]
    assert set(orch.servers) == {"orch-1"}
    kinds = [e.kind for e in orch.events]
    assert kinds.count("registered") == 3 and kinds.count("stopped") == 2
    # The process stops only after its drain: every "stopped" follows that server's "drained".
    for name in ("orch-2", "orch-3"):
        order = [e.kind for e in orch.events if e.server == name]
        assert order.index("drained") < order.index("stopped")


def test_drain_is_retried_until_it_succeeds():
    gauge, fleet, launcher = FakeGauge(2), FakeFleet(timeouts={"orch-2": 2}), FakeLauncher()
    orch, clock = _orchestrator(gauge, fleet, launcher)
    orch.tick()
    gauge.value, clock.now = 1, 20
    orch.tick()
    assert [e.kind for e in orch.events if e.server == "orch-2"][-4:] == [
        "drain_timeout",
        "drain_timeout",
        "drained",
        "stopped",
    ]
    assert launcher.stopped == ["orch-2"]


def test_failed_registration_gives_the_slot_back_and_the_next_tick_retries():
    gauge, fleet, launcher = FakeGauge(1), FakeFleet(fail_register={"orch-1"}), FakeLauncher()
    orch, clock = _orchestrator(gauge, fleet, launcher)
    orch.tick()
    assert orch.servers == {} and launcher.stopped == ["orch-1"]
    assert any(e.kind == "start_failed" and e.server == "orch-1" for e in orch.events)
    clock.now = 2
    orch.tick()
    assert fleet.registered == ["orch-2"]


def test_a_server_that_dies_is_deregistered_and_replaced():
    gauge, fleet, launcher = FakeGauge(2), FakeFleet(), FakeLauncher()
    orch, clock = _orchestrator(gauge, fleet, launcher)
    orch.tick()
    launcher.running.discard("orch-1")  # the process exited by itself
    clock.now = 2
    orch.tick()
    assert "orch-1" in fleet.drained  # its row is deregistered
    assert set(orch.servers) == {"orch-2", "orch-3"}
    assert any(e.kind == "lost" and e.server == "orch-1" for e in orch.events)


def test_gauge_outage_does_not_drain():
    gauge = FakeGauge(3)
    orch, clock = _orchestrator(gauge)
    orch.tick()
    gauge.value, clock.now = None, 60
    assert orch.tick().changes is False and orch.counts()["serving"] == 3


def test_stop_stops_every_server_without_draining():
    gauge, fleet, launcher = FakeGauge(2), FakeFleet(), FakeLauncher()
    orch, _ = _orchestrator(gauge, fleet, launcher)
    orch.tick()
    orch.stop()
    assert sorted(launcher.stopped) == ["orch-1", "orch-2"] and fleet.drained == [] and orch.servers == {}


def test_orchestrator_for_a_stack_reads_its_settings(tmp_path, monkeypatch):
    from deploy.local.orchestrator import orchestrator_for
    from deploy.local.orchestrator_io import HttpFleetControl, ManageFleetControl
    from deploy.local.stack import Stack

    monkeypatch.delenv("ORCHESTRATOR_FLEET_API", raising=False)
    stack = Stack(var_dir=tmp_path, web_port=8123, with_triton=False, env={"ORCHESTRATOR_MAX_SERVERS": "6"})
    orch = orchestrator_for(stack)
    assert orch.bounds == Bounds(1, 6) and orch.fixed_servers == 0
    assert isinstance(orch.fleet, HttpFleetControl) and orch.fleet.base_url == "http://127.0.0.1:8123"
    assert stack.env["METRICS_DB_GAUGES"] == "1" and stack.env["FLEET_TOKEN"] and stack.env["METRICS_TOKEN"]
    # The runner's own Triton is one server of the pool: it is subtracted, and the floor drops to 0.
    own = Stack(var_dir=tmp_path, env={"ORCHESTRATOR_FLEET_API": "manage"})
    orch = orchestrator_for(own)
    assert orch.bounds == Bounds(0, 4) and orch.fixed_servers == 1 and isinstance(orch.fleet, ManageFleetControl)
    with pytest.raises(ValueError, match="ORCHESTRATOR_FLEET_API"):
        orchestrator_for(Stack(var_dir=tmp_path, env={"ORCHESTRATOR_FLEET_API": "grpc"}))


# --- the HTTP clients against a stand-in server (the real endpoints: tests/e2e/test_autoscale.py) ----------


@pytest.fixture
def http_stub():
    """A local HTTP server answering from a table {(method, path): (status, body)} and recording requests."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    routes: dict[tuple[str, str], tuple[int, str]] = {}
    seen: list[tuple[str, str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            seen.append((method, self.path, self.headers.get("Authorization", ""), body))
            status, text = routes.get((method, self.path), (404, "no route"))
            self.send_response(status)
            self.send_header("Content-Length", str(len(text.encode())))
            self.end_headers()
            self.wfile.write(text.encode())

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", routes, seen
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_gauge_sends_the_token_and_holds_on_errors(http_stub):
    from deploy.local.orchestrator_io import MetricsGauge

    base, routes, seen = http_stub
    routes[("GET", "/metrics")] = (200, 'batch_fleet_desired_servers{pool="default"} 2.0\n')
    gauge = MetricsGauge(f"{base}/metrics", "s3cret")
    assert gauge.desired_servers() == 2 and seen[-1][2] == "Bearer s3cret"
    routes[("GET", "/metrics")] = (401, "unauthorized\n")
    assert gauge.desired_servers() is None
    assert MetricsGauge(f"{base}/elsewhere", "s3cret").desired_servers() is None


def test_http_fleet_control_registers_and_reads_the_drain_answer(http_stub):
    from deploy.local.orchestrator_io import HttpFleetControl

    base, routes, seen = http_stub
    fleet = HttpFleetControl(base, "tok", pool="a100", gpu_memory_gib=80)
    server = LocalServer("orch-a100-1", "http://h:1", "h:2", "http://h:3/metrics")
    routes[("POST", "/internal/fleet/servers")] = (201, "{}")
    fleet.register(server)
    method, path, auth, body = seen[-1]
    assert (method, path, auth) == ("POST", "/internal/fleet/servers", "Bearer tok")
    assert body == {
        "name": "orch-a100-1",
        "grpc_url": "h:2",
        "http_url": "http://h:1",
        "metrics_url": "http://h:3/metrics",
        "pool": "a100",
        "gpu_memory_gib": [80],
    }
    # The wait is capped at the endpoint's 60 s; 202 is "still draining", 200 "drained".
    routes[("POST", "/internal/fleet/servers/orch-a100-1/drain?wait=60")] = (202, "{}")
    assert fleet.drain("orch-a100-1", timeout_s=300) is False
    routes[("POST", "/internal/fleet/servers/orch-a100-1/drain?wait=60")] = (200, "{}")
    assert fleet.drain("orch-a100-1", timeout_s=300) is True
    routes[("POST", "/internal/fleet/servers")] = (403, '{"error": {"code": "invalid_token"}}')
    with pytest.raises(RuntimeError, match=r"403.*invalid_token"):
        fleet.register(server)

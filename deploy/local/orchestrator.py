"""The local runner's orchestrator mode: local tritonservers follow `batch_fleet_desired_servers{pool}`.

What KEDA and Kubernetes do in production (deploy/k8s/), with processes on this machine instead of pods:
every `interval_s` the orchestrator scrapes the control plane's /metrics (the same gauge the KEDA
`prometheus` trigger reads), decides with deploy/local/scale_policy.py, and then

* scale-out: starts a tritonserver on free ports (explicit model control, nothing loaded), waits until it
  is ready and registers it (what the Triton pod's init step or sidecar does); the placement loop then
  loads models onto it;
* scale-in: drains it (the PreStop hook: cordon, in-flight calls finish, placements move, deregister),
  again while the drain answers "still draining", and only then stops the process;
* a server process that dies on its own is forgotten and replaced on the next tick; its row is drained
  (deregistered) in the background, while the heartbeat and failover cover its shards as for any crash.

Starts and drains run in worker threads, so a slow drain never delays a scale-out. Every decision that
changes something, and every change of the gauge, is logged (logger `deploy.local.orchestrator`) and kept
in `events` with a monotonic timestamp, which the autoscaling scenario reads for its timings.

Registration and drain go through `POST /internal/fleet/servers[/<name>/drain]` (FLEET_TOKEN) by default,
or with ORCHESTRATOR_FLEET_API=manage through `manage.py fleet_register` / `fleet_drain`: the same
services (controlplane/fleet/membership/join_leave.py), but a manage.py run costs seconds of start-up on a loaded host.

Turned on in the stack with `LOCAL_ORCHESTRATOR=1` (deploy/local/stack.py); `orchestrator_for` reads
the ORCHESTRATOR_* variables below.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from deploy.local.orchestrator_io import (
    HttpFleetControl,
    LocalServer,
    LocalTritonLauncher,
    ManageFleetControl,
    MetricsGauge,
)
from deploy.local.scale_policy import Bounds, Decision, Observation, decide
from deploy.local.triton_server import DEFAULT_MODEL_REPOSITORY, LocalTritonError

if TYPE_CHECKING:
    from deploy.local.stack import Stack

logger = logging.getLogger(__name__)


class GaugeReader(Protocol):
    def desired_servers(self) -> int | None: ...


class FleetControl(Protocol):
    def register(self, server: LocalServer) -> None: ...

    def drain(self, name: str, timeout_s: float) -> bool: ...


class ServerLauncher(Protocol):
    def spawn(self, name: str) -> LocalServer: ...

    def wait_ready(self, server: LocalServer) -> None: ...

    def alive(self, server: LocalServer) -> bool: ...

    def stop(self, server: LocalServer) -> None: ...


@dataclass(frozen=True)
class Event:
    at: float  # the orchestrator's clock (time.monotonic by default)
    kind: str  # decide, started, registered, start_failed, draining, drained, stopped, lost
    server: str = ""
    detail: str = ""


@dataclass
class _Managed:
    server: LocalServer
    status: str  # starting, serving, draining
    since: float


@dataclass
class Orchestrator:
    gauge: GaugeReader
    fleet: FleetControl
    launcher: ServerLauncher
    bounds: Bounds = field(default_factory=Bounds)
    # KEDA polls every 30 s by default; locally a short interval keeps the scenario short.
    interval_s: float = 2.0
    scale_in_window_s: float = 30.0
    drain_timeout_s: float = 60.0
    fixed_servers: int = 0
    name_prefix: str = "orch"
    clock: Callable[[], float] = time.monotonic
    # Tests pass False to run starts and drains inline, one tick at a time.
    background: bool = True
    events: list[Event] = field(default_factory=list, init=False)
    servers: dict[str, _Managed] = field(default_factory=dict, init=False)
    _history: list[Observation] = field(default_factory=list, init=False, repr=False)
    _count: int = field(default=0, init=False, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def record(self, kind: str, server: str = "", detail: str = "") -> None:
        self.events.append(Event(self.clock(), kind, server, detail))
        logger.info("orchestrator %s %s %s", kind, server, detail)

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {"starting": 0, "serving": 0, "draining": 0}
            for managed in self.servers.values():
                out[managed.status] += 1
            return out

    def tick(self) -> Decision:
        """One reconcile: reap dead servers, read the gauge, decide, act."""
        now = self.clock()
        self._reap()
        desired = self.gauge.desired_servers()
        previous = self._history[-1].desired if self._history else None
        self._history.append(Observation(now, desired))
        self._history = [o for o in self._history if now - o.at <= self.scale_in_window_s] or self._history[-1:]
        with self._lock:
            by_age = sorted(self.servers.values(), key=lambda m: m.since)
            serving = [m.server.name for m in by_age if m.status == "serving"]
            starting = sum(1 for m in by_age if m.status == "starting")
        decision = decide(
            history=self._history,
            now=now,
            serving=serving,
            starting=starting,
            bounds=self.bounds,
            scale_in_window_s=self.scale_in_window_s,
            fixed_servers=self.fixed_servers,
        )
        if decision.changes or desired != previous or len(self._history) == 1:
            self.record("decide", detail=decision.reason)
        for _ in range(decision.start):
            self._start_one()
        for name in decision.drain:
            with self._lock:
                managed = self.servers[name]
                managed.status, managed.since = "draining", now
            self._submit(self._drain, managed.server)
        return decision

    def _reap(self) -> None:
        with self._lock:
            dead = [m for m in self.servers.values() if m.status != "draining" and not self.launcher.alive(m.server)]
            for managed in dead:
                del self.servers[managed.server.name]
        for managed in dead:
            self.record("lost", managed.server.name, f"exited while {managed.status}")
            if managed.status == "serving":
                # Deregister the dead row; the heartbeat already keeps work away from it.
                self._submit(self._deregister, managed.server)

    def _start_one(self) -> None:
        self._count += 1
        name = f"{self.name_prefix}-{self._count}"
        try:
            server = self.launcher.spawn(name)
        except (OSError, LocalTritonError) as exc:
            self.record("start_failed", name, str(exc))
            return
        with self._lock:
            self.servers[name] = _Managed(server, "starting", self.clock())
        self.record("started", name, server.grpc_url)
        self._submit(self._bring_up, server)

    def _bring_up(self, server: LocalServer) -> None:
        try:
            self.launcher.wait_ready(server)
            if self._stopping.is_set():
                return
            self.fleet.register(server)
        except Exception as exc:  # noqa: BLE001 - any failure: give the slot back, the next tick retries
            self.record("start_failed", server.name, str(exc).splitlines()[0] if str(exc) else repr(exc))
            with self._lock:
                self.servers.pop(server.name, None)
            self.launcher.stop(server)
            return
        with self._lock:
            managed = self.servers.get(server.name)
            if managed is not None and managed.status == "starting":
                managed.status, managed.since = "serving", self.clock()
        self.record("registered", server.name, server.grpc_url)

    def _drain(self, server: LocalServer) -> None:
        self.record("draining", server.name)
        while not self._stopping.is_set():
            try:
                if self.fleet.drain(server.name, self.drain_timeout_s):
                    break
            except Exception as exc:  # keep the server up and try again
                logger.exception("draining %s failed", server.name)
                self.record("drain_failed", server.name, str(exc).splitlines()[0] if str(exc) else repr(exc))
                self._stopping.wait(self.interval_s)
                continue
            self.record("drain_timeout", server.name, f"still draining after {self.drain_timeout_s:g} s")
        else:
            return  # the orchestrator is stopping: stop() stops the process
        self.record("drained", server.name)
        self.launcher.stop(server)
        with self._lock:
            self.servers.pop(server.name, None)
        self.record("stopped", server.name)

    def _deregister(self, server: LocalServer) -> None:
        try:
            self.fleet.drain(server.name, self.drain_timeout_s)
        except Exception:  # best effort: the heartbeat has marked it unhealthy anyway
            logger.exception("deregistering lost server %s failed", server.name)

    def _submit(self, fn: Callable[[LocalServer], None], server: LocalServer) -> None:
        if not self.background:
            fn(server)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="orchestrator")
        self._pool.submit(fn, server)

    def start(self) -> Orchestrator:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="orchestrator", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:
                logger.exception("orchestrator tick failed")
            self._stopping.wait(self.interval_s)

    def stop(self) -> None:
        """Stop the loop and every server it runs (the whole stack is going away: no drains)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        with self._lock:
            managed = list(self.servers.values())
            self.servers.clear()
        # In parallel: each stop waits for its server's own exit (bounded), and one slow server must not
        # add its wait to every other's.
        stoppers = [threading.Thread(target=self.launcher.stop, args=(m.server,)) for m in managed]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()


def _env_number(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def orchestrator_for(stack: Stack) -> Orchestrator:
    """The orchestrator of a stack in orchestrator mode. Call before the stack starts its web process: it
    turns on the metrics endpoint and the database gauges there, with a token of its own unless one is set."""
    for token in ("METRICS_TOKEN", "FLEET_TOKEN"):
        stack.env.setdefault(token, os.environ.get(token) or secrets.token_urlsafe(24))
    stack.env["METRICS_DB_GAUGES"] = "1"
    env = {**os.environ, **stack.env}  # the stack's own env wins, as in its children
    pool = env.get("ORCHESTRATOR_POOL", "default")
    # The runner's own Triton (with_triton) is one server of the pool that the gauge counts.
    fixed = 1 if stack.with_triton else 0
    bounds = Bounds(
        int(_env_number(env, "ORCHESTRATOR_MIN_SERVERS", 0 if fixed else 1)),
        int(_env_number(env, "ORCHESTRATOR_MAX_SERVERS", 4)),
    )
    gpu_gib = _env_number(env, "ORCHESTRATOR_GPU_MEMORY_GIB", 16)
    # http (default): the registration endpoints, as a pod's sidecar and PreStop hook; manage: the commands.
    api = env.get("ORCHESTRATOR_FLEET_API", "http")
    if api not in ("http", "manage"):
        raise ValueError(f"ORCHESTRATOR_FLEET_API={api!r}: use http or manage")
    fleet: FleetControl = (
        HttpFleetControl(stack.base_url, stack.env["FLEET_TOKEN"], pool, gpu_gib)
        if api == "http"
        else ManageFleetControl(stack.manage, pool, gpu_gib)
    )
    repository = Path(os.environ.get("TRITON_MODEL_REPOSITORY") or DEFAULT_MODEL_REPOSITORY)
    return Orchestrator(
        gauge=MetricsGauge(f"{stack.base_url}/metrics", stack.env["METRICS_TOKEN"], pool),
        fleet=fleet,
        launcher=LocalTritonLauncher(stack.log_dir, repository),
        bounds=bounds,
        interval_s=_env_number(env, "ORCHESTRATOR_INTERVAL_SECONDS", 2.0),
        scale_in_window_s=_env_number(env, "ORCHESTRATOR_SCALE_IN_WINDOW_SECONDS", 30.0),
        drain_timeout_s=_env_number(env, "ORCHESTRATOR_DRAIN_TIMEOUT_SECONDS", 60.0),
        fixed_servers=fixed,
        name_prefix=f"orch-{pool}",
    )

"""Local process runner: Triton, web, Celery worker and beat as child processes of one Python process.

Used by `make demo`, `make serve`, the end-to-end tests and the benchmark, so all four run the stack
the same way. Production runs the same four commands under Kubernetes or compose (see deploy/).

With its own Triton (`with_triton=True`, the default) the runner registers that server as a managed fleet
server, keeps the shipped models warm and waits until they are loaded: dispatch, placement and the admin's
fleet pages then work as in production. With `with_triton=False` it runs unmanaged on the Triton at
`triton_grpc_url` (TRITON_GRPC_URLS), or on whatever the caller registers itself (deploy/local/fleet.py).

With `supervise=True` (`make serve`, `make demo`) it behaves like an orchestrator: a child that exits is
started again after a backoff (1 s doubling to 30 s; back to 1 s once it stayed up a minute), and each
restart is logged. Off by default, so tests that kill a process on purpose decide what happens next.

The children's signing key: DJANGO_SECRET_KEY when the caller sets it, else a random key generated once per
var dir into `<var_dir>/secret_key` (mode 0600), which `manage.py` run by hand next to it also reads
(controlplane/core/env.py, env_secret_key)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.commands import beat_command, celery_worker_command, gunicorn_command
from deploy.local.orchestrator import Orchestrator, orchestrator_for
from deploy.local.supervision import (
    Restart,
    dying_with_parent,
    niced,
    secret_key_ensure,
    supervise,
    terminate_together,
)
from deploy.local.triton_server import (
    free_port,
    log_tail,
    start_local_server,
    trace_args_from_env,
    wait_until_ready,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# The real instruct LLM (triton_models/smollm2): warm in `make demo` and `make serve`, not in every test stack,
# where its ~7 s load and ~1.4 GB would be paid by stacks that never generate.
SERVED_LLM = "smollm2-135m-instruct"
DEFAULT_WARM_MODELS = ("identity", "scale2", "all-MiniLM-L6-v2")
logger = logging.getLogger(__name__)


@dataclass
class Stack:
    var_dir: Path
    web_port: int = 8000
    env: dict[str, str] = field(default_factory=dict)
    # Per child (web, worker, control, validation, housekeeping, webhooks, beat), on top of env: what differs
    # between deployments on one host, e.g. each worker's WORKER_METRICS_PORT and PROMETHEUS_MULTIPROC_DIR.
    process_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # Slots (shards) run side by side per worker: the default slot cap is two per model instance, so four
    # threads let two models run at once. WORKER_CONCURRENCY overrides it (the benchmark compares).
    worker_concurrency: int = field(default_factory=lambda: int(os.environ.get("WORKER_CONCURRENCY", "4")))
    # Processes, not threads, for the shard worker: two slots in one process share the GIL, and measured
    # on the fairness benchmark (2 cores) prefork doubled the identity flood's lines/s and halved the wait
    # of a small tenant's batch behind it. WORKER_POOL=threads is the comparison.
    worker_pool: str = field(default_factory=lambda: os.environ.get("WORKER_POOL", "prefork"))
    # CPU niceness added to the control plane's own processes (web, workers, beat); Triton keeps the runner's.
    # On a host they share, the model server's intra-op threads then get the cores first: direct Triton beside
    # ~0.6 core of load ran 177-182 texts/s with it at nice 0, median 206 niced (docs/performance.md,
    # "The host"). The control plane still gets every cycle the model leaves idle. 0 turns it off.
    control_plane_nice: int = field(default_factory=lambda: int(os.environ.get("LOCAL_CONTROL_PLANE_NICE", "10")))
    with_triton: bool = True
    with_beat: bool = True
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    triton_grpc_url: str = ""
    # The fleet name of the runner's own Triton; registering again under it (a restarted `make serve` on a
    # kept database) moves the row to the new port instead of leaving a dead server behind.
    triton_server_name: str = "local"
    # Declared GPU memory of the runner's Triton, one size per GPU ("16G", "16G,16G"). This host has no
    # GPU, yet the planner places against GPU memory: 16 GiB is one common inference card and holds the
    # shipped models (~0.6 GiB) with room to spare, so nothing is evicted by accident. Set it smaller to
    # watch eviction, or to your card's size.
    triton_gpu_memory: str = field(default_factory=lambda: os.environ.get("LOCAL_TRITON_GPU_MEMORY", "16G"))
    # Kept loaded while idle (min_instances=1) so the first small batch does not wait for a model load:
    # the catalogue models shipped in triton_models/ (controlplane/fleet/catalogue/seed.py).
    warm_models: tuple[str, ...] = DEFAULT_WARM_MODELS
    warm_timeout_s: float = 180.0
    # How long registering and loading the warm models took (the benchmark shows it).
    warm_seconds: float = field(default=0.0, init=False)
    triton_metrics_url: str = field(default="", init=False)
    triton_http_url: str = field(default="", init=False)
    _warm_started: float = field(default=0.0, init=False, repr=False)
    # Restart children that exit (see the module docstring). Tests that kill processes on purpose keep it off.
    supervise: bool = False
    # Orchestrator mode (deploy/local/orchestrator.py): local tritonservers follow the desired-servers gauge.
    orchestrate: bool = field(default_factory=lambda: os.environ.get("LOCAL_ORCHESTRATOR") == "1")
    orchestrator: Orchestrator | None = field(default=None, init=False, repr=False)
    restarts: list[Restart] = field(default_factory=list, init=False)
    _commands: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)
    _triton_ports: tuple[int, int, int] = field(default=(0, 0, 0), init=False, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _supervisor: threading.Thread | None = field(default=None, init=False, repr=False)
    # stop(): how long the children together get to exit after SIGTERM before the stragglers get SIGKILL.
    stop_timeout_s: float = 20.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log_dir(self) -> Path:
        return self.var_dir / "logs"

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env["CONTROLPLANE_VAR_DIR"] = str(self.var_dir)
        env["PYTHONPATH"] = str(REPO_ROOT)
        # Webhook endpoints on this machine (a receiver on 127.0.0.1) are what a local run has; production
        # refuses loopback like every private address.
        env.setdefault("WEBHOOK_ALLOW_LOOPBACK", "1")
        # The service's settings, whatever the calling process runs under (pytest: tests.settings).
        env["DJANGO_SETTINGS_MODULE"] = self.env.get("DJANGO_SETTINGS_MODULE", "controlplane.settings")
        if not env.get("DJANGO_SECRET_KEY"):
            env["DJANGO_SECRET_KEY"] = secret_key_ensure(self.var_dir)
        if self.triton_grpc_url and not self.with_triton:
            # Unmanaged: dispatch loads models on first use here. The runner's own Triton is a registered
            # server instead, and routing follows its placements.
            env["TRITON_GRPC_URLS"] = self.triton_grpc_url
        return env

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [PYTHON, str(REPO_ROOT / "manage.py"), *args],
            env=self.child_env(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        self._commands[name] = cmd  # what a supervised restart runs again
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                # Killed with us (SIGKILL, OOM): an orphaned worker or beat would consume the next stack's
                # messages on a shared broker. Spawned from the main thread or the supervisor thread, which
                # ends only in stop() (the signal follows the forking thread).
                dying_with_parent(niced(cmd, self.control_plane_nice)),
                env={**self.child_env(), **self.process_env.get(name, {})},
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self._lock:
            self.procs[name] = proc
        return proc

    def start(self) -> Stack:
        try:
            return self._start()
        except BaseException:
            # A half-started stack must not outlive us: web, worker and beat run in their own sessions.
            self.stop()
            raise

    def _start(self) -> Stack:
        self.var_dir.mkdir(parents=True, exist_ok=True)
        self.orchestrator = orchestrator_for(self) if self.orchestrate else None  # sets the web's metrics env
        if self.with_triton:
            self.start_triton()
        self.manage("migrate", "--noinput", "-v0")
        if self.with_triton:
            self.register_triton()
        self._spawn("web", gunicorn_command(self.web_port))
        self.start_worker()
        self.start_control_worker()
        self.start_validation_worker()
        self.start_housekeeping_worker()
        self.start_webhooks_worker()
        if self.with_beat:
            self._spawn("beat", beat_command(self.var_dir / "celerybeat-schedule", quiet=self._quiet()))
        if self.with_triton:
            self.wait_warm()  # loads run while web and the worker boot
        self._wait_http(f"{self.base_url}/healthz", "web")
        if self.supervise:
            self._stopping.clear()
            self._supervisor = threading.Thread(target=self._supervise, name="stack-supervisor", daemon=True)
            self._supervisor.start()
        if self.orchestrator is not None:
            self.orchestrator.start()
        return self

    def start_triton(self) -> None:
        self._triton_ports = ports = free_port(), free_port(), free_port()
        proc = self._spawn_triton()
        wait_until_ready(f"http://127.0.0.1:{ports[0]}", 90, proc=proc, log_path=self.log_dir / "triton.log")
        self.triton_grpc_url = f"127.0.0.1:{ports[1]}"
        self.triton_http_url = f"http://127.0.0.1:{ports[0]}"
        self.triton_metrics_url = f"http://127.0.0.1:{ports[2]}/metrics"

    def _spawn_triton(self) -> subprocess.Popen[bytes]:
        # The same ports every time: the fleet row registered below keeps pointing at a restarted server.
        # die_with_parent fires when the forking *thread* ends: the main thread, or for a restart the
        # supervisor thread, which ends only in stop(), where Triton is stopped anyway.
        http_port, grpc_port, metrics_port = self._triton_ports
        proc = start_local_server(
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            log_path=self.log_dir / "triton.log",
            extra_args=("--exit-timeout-secs=5", *trace_args_from_env(self.child_env())),
            die_with_parent=True,
        )
        with self._lock:
            self.procs["triton"] = proc
        return proc

    def register_triton(self) -> None:
        """Put the runner's Triton under management with declared GPUs and raise the warm models' floor."""
        self._warm_started = time.monotonic()
        self.manage(
            "fleet_register",
            self.triton_server_name,
            self.triton_grpc_url,
            "--gpu-memory",
            self.triton_gpu_memory,
            "--metrics-url",
            self.triton_metrics_url,
        )
        if self.warm_models:
            self.manage("catalogue_warm", *self.warm_models, "--min-instances", "1", "--actor", "runner")

    def wait_warm(self) -> None:
        """Block until the warm models are loaded on a routable server (reconciling at once rather than on
        beat's first tick); on failure raise with the Triton and worker log tails."""
        if self.warm_models:
            result = self.manage(
                "fleet_wait_ready",
                *self.warm_models,
                "--timeout",
                f"{self.warm_timeout_s:g}",
                "--actor",
                "runner",
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"warm models {', '.join(self.warm_models)} not served by {self.triton_server_name} "
                    f"({self.triton_grpc_url}):\n{result.stdout}{result.stderr}\n"
                    f"--- triton.log ---\n{log_tail(self.log_dir / 'triton.log')}\n"
                    f"--- worker.log ---\n{log_tail(self.log_dir / 'worker.log', 30)}"
                )
        self.warm_seconds = time.monotonic() - self._warm_started

    def start_worker(self, name: str = "worker") -> subprocess.Popen[bytes]:
        """The shard worker: runs the scheduler's slots (queue ``shards``)."""
        return self._celery_worker(name, "shards", self.worker_concurrency, self.worker_pool)

    def start_control_worker(self, name: str = "control") -> subprocess.Popen[bytes]:
        """Finalize (a cancel's, an expiry's, a dead finalizer's): per-batch tenant work that waits on Postgres
        and storage, on a worker of its own so that neither validation nor beat's jobs delay it."""
        return self._celery_worker(name, "control", 2)

    def start_validation_worker(self, name: str = "validation") -> subprocess.Popen[bytes]:
        """Validation parses tenants' files, CPU-bound: processes, so one tenant's huge file holds one process and
        its GIL, never a thread beside finalize or beat's jobs. Two: this host's cores."""
        return self._celery_worker(name, "validation", 2, "prefork")

    def start_housekeeping_worker(self, name: str = "housekeeping") -> subprocess.Popen[bytes]:
        """Beat's jobs (rescue, expiry, outbox relay, top-ups, fleet loops...) on a queue no tenant's work reaches."""
        return self._celery_worker(name, "housekeeping", 2)

    def start_webhooks_worker(self, name: str = "webhooks") -> subprocess.Popen[bytes]:
        """Webhook attempts wait on tenants' receivers (up to 10 s each): their own worker, so a slow receiver
        never delays validation, finalization or shards. Four threads: four slow receivers at once."""
        return self._celery_worker(name, "webhooks", 4)

    def _celery_worker(
        self, name: str, queues: str, concurrency: int, pool: str = "threads"
    ) -> subprocess.Popen[bytes]:
        return self._spawn(name, celery_worker_command(name, queues, concurrency, pool, quiet=self._quiet()))

    def _quiet(self) -> bool:
        return self.child_env().get("LOG_FORMAT") == "json"

    def kill(self, name: str) -> None:
        """SIGKILL a process group: what a node failure or the OOM killer does to a worker. The process is
        forgotten, so even a supervising stack does not restart it (signal ``procs[name]`` to crash it)."""
        with self._lock:
            proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def signal(self, name: str, sig: int) -> None:
        """Send a signal to a child's whole process group (Triton with its python-backend stubs): SIGSTOP
        and SIGCONT make a hung server, as the chaos suite needs."""
        with self._lock:
            proc = self.procs[name]
        os.killpg(proc.pid, sig)

    def restart_triton(self, timeout_s: float = 90) -> None:
        """Start the runner's Triton again on its ports, empty (explicit mode), after a kill; returns once
        the server is ready. Its fleet row still points here: the heartbeat and reconciler do the rest."""
        with self._lock:
            old = self.procs.get("triton")
        if old is not None and old.poll() is None:
            raise RuntimeError("triton is still running; kill it first")
        proc = self._spawn_triton()
        wait_until_ready(self.triton_http_url, timeout_s, proc=proc, log_path=self.log_dir / "triton.log")

    def _supervise(self) -> None:
        """Restart children that exit, each on its own backoff, until stop(). Runs in a thread."""
        supervise(self.procs, self._lock, self._stopping, self._respawn, self.restarts.append, log_dir=self.log_dir)

    def _respawn(self, name: str) -> None:
        if name == "triton":
            self._spawn_triton()
        else:
            self._spawn(name, self._commands[name])

    # Generous: on a busy 2-core host gunicorn's first answer (Django imported by each worker) took over 60 s
    # while a test suite ran in parallel workers; the wait ends as soon as it answers.
    def _wait_http(self, url: str, name: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited early:\n{log_tail(self.log_dir / f'{name}.log')}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{name} not answering at {url}:\n{log_tail(self.log_dir / f'{name}.log')}")

    def stop(self) -> None:
        """Every child and every orchestrated server at once: SIGTERM to all, one shared deadline
        (``stop_timeout_s``), then SIGKILL."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()  # no restart from here on
            self._supervisor = None
        orchestrated = None
        if self.orchestrator is not None:  # its servers, in parallel, beside ours
            orchestrated = threading.Thread(target=self.orchestrator.stop, name="orchestrator-stop")
            orchestrated.start()
        with self._lock:
            triton = [proc.pid for name, proc in self.procs.items() if name == "triton"]
            procs = list(self.procs.values())
            self.procs.clear()
        terminate_together(procs, timeout_s=self.stop_timeout_s, leader_only=triton)
        if orchestrated is not None:
            orchestrated.join()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


find_free_port = free_port  # the name tests and benches import; one port finder (triton_server.py)

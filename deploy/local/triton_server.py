"""Run the `tritonserver` binary that ships inside the `nvidia-pytriton` wheel.

This is the embedded default: a real Triton 2.51 on CPU with no container. Development only: production
runs NGC Triton containers (deploy/), so this lives with the local runner, not in the runtime adapter
(controlplane/triton/). Plain Python on purpose (no Django import) so the process runner, the test fixtures
and ops scripts can all use it. The foreground CLI is `python -m deploy.local.triton_serve`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.local.supervision import dying_with_parent

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "triton_models"
DEFAULT_BACKEND_CACHE = REPO_ROOT / "var" / "triton-backends"
DEFAULT_HTTP_PORT = 8010  # 8000 belongs to the web app
DEFAULT_GRPC_PORT = 8011
DEFAULT_METRICS_PORT = 8012


class LocalTritonError(RuntimeError):
    """The local server could not be prepared, started or did not become ready."""


def pytriton_dist_dir() -> Path:
    """`<site-packages>/pytriton/tritonserver`, found without importing pytriton (slow, pulls in a lot)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise LocalTritonError("nvidia-pytriton is not installed; it ships the tritonserver binary")
    dist = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not dist.is_dir():
        raise LocalTritonError(f"{dist} is missing: unexpected nvidia-pytriton wheel layout")
    return dist


def tritonserver_binary() -> Path:
    binary = pytriton_dist_dir() / "bin" / "tritonserver"
    if not os.access(binary, os.X_OK):
        raise LocalTritonError(f"{binary} is missing or not executable")
    return binary


def wheel_library_dirs() -> list[Path]:
    # auditwheel moved libtritonserver, libcudart... here. The binaries find it through an $ORIGIN RPATH,
    # but the python backend and its stub are copied elsewhere, where that relative RPATH misses.
    return [pytriton_dist_dir().parent.parent / "nvidia_pytriton.libs"]


def _copy_if_changed(src: Path, dst: Path) -> None:
    if dst.exists():
        s, d = src.stat(), dst.stat()
        if s.st_size == d.st_size and int(s.st_mtime) == int(d.st_mtime):
            return
    # Copy to a temp name then rename: two test sessions preparing the cache at once never see a
    # half-written stub, and a running server keeps its already-mapped inode.
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.")
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def prepare_backend_dir(target: Path | None = None) -> Path:
    """Build `<target>/python/` = python backend + the stub for this interpreter; return `<target>`.

    The wheel keeps one stub per Python version apart from the backend, and Triton looks for the stub
    next to `libtriton_python.so`, so the wheel directory cannot be used as is (and may be read-only).
    Idempotent: unchanged files are not copied again.
    """
    target = Path(target) if target is not None else DEFAULT_BACKEND_CACHE
    dist = pytriton_dist_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise LocalTritonError(f"nvidia-pytriton has no python backend stub for Python {version}")
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for src in (
        dist / "backends" / "python" / "libtriton_python.so",
        dist / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ):
        _copy_if_changed(src, python_dir / src.name)
    return target


def _site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def build_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and the python-backend stubs it spawns."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    # The stub links libpython3.11.so.1.0 by soname. Unless this interpreter's LIBDIR comes first the
    # loader picks Debian's copy, whose ABI differs from our stdlib's extension modules:
    # `import ssl` then dies with "undefined symbol: _PyModule_Add".
    lib_dirs = [str(libdir)] if libdir else []
    lib_dirs += [str(p) for p in wheel_library_dirs()]
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(lib_dirs)
    # The stub embeds the base interpreter. The 3.11 and 3.12 stubs of this wheel were seen to ignore
    # PYTHONPATH and to find the venv (torch, transformers) through the first python3 on PATH, set below;
    # PYTHONPATH is kept for stubs that do read it.
    python_path = _site_packages()
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = ":".join(python_path)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # Model code loads weights from installed packages only; never reach for a model hub.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The tokenizer runs inside a stub that Triton forks from; avoid the fork-after-threads warning.
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers draws a weight-loading progress bar per load; it is noise in a server log.
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return env


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver with a device is present (the device nodes the driver creates); LOCAL_TRITON_GPU=0/1
    overrides the guess."""
    forced = os.environ.get("LOCAL_TRITON_GPU", "")
    if forced in ("0", "1"):
        return forced == "1"
    return Path("/dev/nvidiactl").exists() and Path("/dev/nvidia0").exists()


def server_command(
    model_repository: Path | str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    backend_dir: Path,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
) -> list[str]:
    return [
        str(tritonserver_binary()),
        f"--model-repository={Path(model_repository).resolve()}",
        # Only the control plane decides what is loaded, so nothing loads at start.
        "--model-control-mode=explicit",
        f"--backend-directory={backend_dir}",
        f"--cache-directory={pytriton_dist_dir() / 'caches'}",
        # Loopback by default: these endpoints include model load/unload, with no authentication.
        f"--http-address={host}",
        f"--grpc-address={host}",
        f"--metrics-address={host}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        # GPU metrics (per-GPU memory and utilisation, the fleet's GPU inventory) where there is an NVIDIA
        # GPU; elsewhere they would only log failures.
        f"--allow-gpu-metrics={'true' if has_nvidia_gpu() else 'false'}",
        # Server readiness = "the process answers". One tenant's broken model must not make the whole
        # server look down to the circuit breaker; model readiness is checked per model.
        "--strict-readiness=false",
        *extra_args,
    ]


def trace_args(endpoint: str, *, service_name: str = "triton", rate: int = 1) -> list[str]:
    """Triton's OpenTelemetry trace mode, exporting over OTLP/HTTP to ``endpoint`` (the base URL, as
    OTEL_EXPORTER_OTLP_ENDPOINT; Triton posts to <endpoint>/v1/traces). A call that carries a W3C
    ``traceparent`` (the control plane's Triton calls do, core/observability/tracing.py) continues that trace inside the
    server; ``rate`` 1 traces every request, so a batch sampled by the control plane is whole here too."""
    return [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=rate={rate}",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,url={endpoint.rstrip('/')}/v1/traces",
        f"--trace-config=opentelemetry,resource=service.name={service_name}",
    ]


def trace_args_from_env(environ: Mapping[str, str]) -> list[str]:
    """trace_args when LOCAL_TRITON_TRACING=1 and OTEL_EXPORTER_OTLP_ENDPOINT is set (the local runner)."""
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if environ.get("LOCAL_TRITON_TRACING", "") != "1" or not endpoint:
        return []
    return trace_args(endpoint, rate=int(environ.get("LOCAL_TRITON_TRACE_RATE", "1")))


def start_local_server(
    model_repository: Path | str = DEFAULT_MODEL_REPOSITORY,
    http_port: int = DEFAULT_HTTP_PORT,
    grpc_port: int = DEFAULT_GRPC_PORT,
    metrics_port: int = DEFAULT_METRICS_PORT,
    log_path: Path | str | None = None,
    extra_args: Sequence[str] = (),
    *,
    backend_dir: Path | None = None,
    die_with_parent: bool = False,
    host: str = "127.0.0.1",
) -> subprocess.Popen[bytes]:
    """Start tritonserver in explicit model-control mode and return at once (see `wait_until_ready`).

    stdout+stderr go to `log_path` (appended) when given, else they are inherited.
    """
    backends = prepare_backend_dir(backend_dir)
    cmd = server_command(model_repository, http_port, grpc_port, metrics_port, backends, extra_args, host)
    if die_with_parent:
        cmd = dying_with_parent(cmd)
    log_file = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 - the child keeps the fd; we close our copy below
    try:
        return subprocess.Popen(
            cmd,
            env=build_env(),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT if log_file else None,
            # Own session: a Ctrl-C meant for pytest or the runner is forwarded once, deliberately.
            start_new_session=True,
        )
    finally:
        if log_file is not None:
            log_file.close()


def stop_local_server(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM (Triton drains in-flight requests), then SIGKILL after `timeout_s`. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _http_ready(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http_url.rstrip('/')}/v2/health/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _grpc_ready(grpc_url: str) -> bool:
    # Imported lazily: controlplane.triton.client is the only module allowed to import tritonclient.
    from controlplane.triton.client import TritonClient

    client = TritonClient(grpc_url, timeout_s=2.0)
    try:
        return client.is_ready()
    finally:
        client.close()


def log_tail(log_path: Path | str | None, lines: int = 60) -> str:
    if log_path is None or not Path(log_path).exists():
        return "(no log)"
    return "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-lines:])


def wait_until_ready(
    url: str,
    timeout_s: float = 60.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | str | None = None,
) -> None:
    """Block until the server reports ready. `url` is `http://host:port` (HTTP) or `host:port` (gRPC).

    Fails fast with the log tail when `proc` exits before becoming ready.
    """
    check = _http_ready if url.startswith(("http://", "https://")) else _grpc_ready
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise LocalTritonError(
                f"tritonserver exited with code {proc.returncode} before ready:\n{log_tail(log_path)}"
            )
        if check(url):
            return
        if time.monotonic() > deadline:
            raise LocalTritonError(f"tritonserver at {url} not ready after {timeout_s}s:\n{log_tail(log_path)}")
        time.sleep(0.2)


def free_port() -> int:
    # Racy by nature (the port is released before Triton binds it); `running_local_server` retries.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalTriton:
    """A running local server, as handed out by `running_local_server` and the test fixtures."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    model_repository: Path

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)


@contextlib.contextmanager
def running_local_server(
    model_repository: Path | str = DEFAULT_MODEL_REPOSITORY,
    *,
    log_path: Path | str,
    timeout_s: float = 60.0,
    extra_args: Sequence[str] = ("--exit-timeout-secs=5",),
    attempts: int = 3,
) -> Iterator[LocalTriton]:
    """Start a server on free ports, wait until ready, yield it, always stop it.

    Retries on a fresh set of ports when a start fails (another process may grab a "free" port first).
    """
    log_path = Path(log_path)
    last_error: Exception | None = None
    for _ in range(attempts):
        ports = free_port(), free_port(), free_port()
        proc = start_local_server(
            model_repository, *ports, log_path=log_path, extra_args=extra_args, die_with_parent=True
        )
        handle = LocalTriton(proc, *ports, log_path=log_path, model_repository=Path(model_repository))
        try:
            wait_until_ready(handle.http_url, timeout_s, proc=proc, log_path=log_path)
        except LocalTritonError as exc:
            stop_local_server(proc, timeout_s=10)
            last_error = exc
            continue
        try:
            yield handle
        finally:
            stop_local_server(proc)
        return
    raise LocalTritonError(f"tritonserver failed to start after {attempts} attempts") from last_error

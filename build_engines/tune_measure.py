"""The tuner's measurements on a real tritonserver: one server for the whole search, a candidate per load.

The server runs over a scratch copy of the model's folder in explicit model-control mode; each candidate is
its config.pbtxt written there (build_engines/tune_config.py) and a load through the repository API. The load
offered is the control plane's: `concurrency` calls in flight, each of `call_rows` rows, from as many client
threads; rows/s counts the rows of the calls that finished inside the measured window, p95 is over those
calls' latencies.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from build_engines.errors import BuildEnginesError, CannotRunHere
from build_engines.tune_config import rewrite
from build_engines.tune_search import Measurement, Shape

# Completions a measurement waits for at least: fewer make a noisy figure of a slow model's few big calls.
MIN_CALLS = 12
SYNTHETIC_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "engineers"]


@dataclass(frozen=True)
class Load:
    concurrency: int  # calls in flight
    call_rows: int | None  # rows a call; None: the candidate's (Shape.call_rows: as the control plane packs for it)
    warmup_s: float
    measure_s: float
    dynamic_dim: int = 16  # the size given to a -1 dimension of a synthetic input


class Workload:
    """The rows a call carries: the model's corpus (texts, sorted by length as the control plane packs
    them) for a single string input, else random rows of each input's declared shape and type."""

    def __init__(self, config: Any, texts: list[str] | None, dynamic_dim: int, seed: int = 0) -> None:
        from tritonclient.utils import triton_to_np_dtype

        self.inputs = []
        for tensor in config.input:
            datatype = _datatype(tensor.data_type)
            dims = [dynamic_dim if d < 0 else int(d) for d in tensor.dims]
            self.inputs.append((tensor.name, datatype, dims, triton_to_np_dtype(datatype)))
        self.outputs = [tensor.name for tensor in config.output]
        self.texts = sorted(texts or [], key=len)
        self.random = np.random.default_rng(seed)

    def client_calls(self, rows: int, worker: int, concurrency: int) -> list[dict[str, np.ndarray]]:
        """The distinct calls one of `concurrency` clients cycles through: at least 4, and together enough to carry
        the whole corpus once, dealt round the clients in length order (call c holds the c-th run of `rows`
        texts), so every candidate shape is measured on the same texts, whatever its rows a call. With a fixed
        number of calls, a small batch would see only the corpus's shortest texts and win for that alone."""
        per_client = max(4, math.ceil(len(self.texts) / max(1, rows * concurrency)))
        return [self.arrays(rows, worker + concurrency * i) for i in range(per_client)]

    def arrays(self, rows: int, call: int) -> dict[str, np.ndarray]:
        arrays = {}
        for name, datatype, dims, np_dtype in self.inputs:
            if datatype == "BYTES":
                arrays[name] = self._strings(rows, call, dims)
            elif np.issubdtype(np_dtype, np.floating):
                arrays[name] = self.random.random((rows, *dims)).astype(np_dtype)
            elif np_dtype == np.bool_:
                arrays[name] = self.random.integers(0, 2, (rows, *dims)).astype(np.bool_)
            else:
                arrays[name] = self.random.integers(0, 100, (rows, *dims)).astype(np_dtype)
        return arrays

    def _strings(self, rows: int, call: int, dims: list[int]) -> np.ndarray:
        count = rows * int(np.prod(dims))
        if self.texts:
            start = (call * count) % len(self.texts)
            picked = [self.texts[(start + i) % len(self.texts)] for i in range(count)]
        else:
            picked = [" ".join(self.random.choice(SYNTHETIC_WORDS, 12)) for _ in range(count)]
        return np.array([t.encode() for t in picked], dtype=np.object_).reshape(rows, *dims)


def _datatype(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2 as pb

    name = str(pb.DataType.Name(data_type)).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def offer_load(url: str, name: str, workload: Workload, load: Load, rows: int) -> Measurement:
    """`load.concurrency` client threads, each with one call in flight: `warmup_s`, then at least `measure_s`
    and `MIN_CALLS` completions (at most 5 x `measure_s`). Rows/s is measured between the window's first and
    last completion, so a window of a few long calls is not rounded to whole calls at its edges."""
    import tritonclient.grpc as grpcclient

    done: list[tuple[float, float]] = []  # (finished, latency) of the calls that finished after the warm-up
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    opened = time.monotonic() + load.warmup_s

    def client_loop(worker: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            calls = []
            for arrays in workload.client_calls(rows, worker, load.concurrency):  # built once
                tensors = []
                for input_name, array in arrays.items():
                    tensor = grpcclient.InferInput(input_name, list(array.shape), _np_datatype(array))
                    tensor.set_data_from_numpy(array)
                    tensors.append(tensor)
                calls.append(tensors)
            outputs = [grpcclient.InferRequestedOutput(o) for o in workload.outputs]
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                client.infer(name, calls[i % len(calls)], outputs=outputs, client_timeout=120.0)
                finished = time.monotonic()
                i += 1
                if finished >= opened and not stop.is_set():
                    with lock:
                        done.append((finished, finished - started))
        except Exception as exc:  # noqa: BLE001 - any failed call fails the candidate, with its message
            with lock:
                errors.append(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__)
            stop.set()
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(w,), daemon=True) for w in range(load.concurrency)]
    for thread in threads:
        thread.start()
    least, most = opened + load.measure_s, opened + 5 * load.measure_s
    while not stop.is_set():
        now = time.monotonic()
        with lock:
            enough = len(done) >= MIN_CALLS
        if now >= most or (now >= least and enough):
            break
        stop.wait(0.02)
    with lock:
        stop.set()
        window = sorted(done)
    for thread in threads:
        thread.join(timeout=130.0)
    if errors:
        return Measurement(0.0, 0.0, error=errors[0])
    if not window:
        return Measurement(0.0, 0.0, error=f"no call finished within {5 * load.measure_s:g} s")
    p95_ms = float(np.percentile([latency for _, latency in window], 95)) * 1e3
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return Measurement(rows_per_s=rows * len(window) / (window[-1][0] - opened + 1e-9), p95_ms=p95_ms)
    return Measurement(rows_per_s=rows * (len(window) - 1) / (window[-1][0] - window[0][0]), p95_ms=p95_ms)


def _np_datatype(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(array.dtype))


def copy_model(source: Path, repository: Path) -> Path:
    """The model folder into the scratch repository: weights hard-linked where the file system allows."""

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    target = repository / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), copy_function=link_or_copy)
    # The config is rewritten per candidate: never through a link into the served folder.
    config = target / "config.pbtxt"
    text = config.read_text()
    config.unlink()
    config.write_text(text)
    return target


class TuneServer:
    """One tritonserver over the scratch repository; `measure(shape)` loads a candidate and offers the load."""

    def __init__(self, repository: Path, name: str, base_text: str, log_path: Path) -> None:
        self.repository, self.name, self.base_text, self.log_path = repository, name, base_text, log_path
        self.url = ""
        self.pid = 0
        self.idle_rss = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> TuneServer:
        try:
            from deploy.local.triton_server import LocalTritonError, running_local_server
        except ImportError as exc:  # pragma: no cover - the repository's own module
            raise CannotRunHere(f"cannot start tritonserver here: {exc}") from exc
        try:
            server = self._stack.enter_context(running_local_server(self.repository, log_path=self.log_path))
        except LocalTritonError as exc:
            raise CannotRunHere(f"tritonserver did not start: {exc}") from exc
        self.url, self.pid = server.grpc_url, server.proc.pid
        self.idle_rss = rss_bytes(self.pid)  # before any model: what a non-python backend grows from
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def load(self, shape: Shape) -> float:
        """Write ``shape`` into the scratch config and (re)load the model; the seconds the load took."""
        return self.load_config(rewrite(self.base_text, shape))

    def load_config(self, text: str) -> float:
        """Write ``text`` as the scratch config and (re)load the model; the seconds the load took."""
        import tritonclient.grpc as grpcclient

        (self.repository / self.name / "config.pbtxt").write_text(text)
        client = grpcclient.InferenceServerClient(self.url)
        try:
            started = time.monotonic()
            client.load_model(self.name)
            return time.monotonic() - started
        finally:
            client.close()

    def measure(self, shape: Shape, workload: Workload, load: Load) -> Measurement:
        from tritonclient.utils import InferenceServerException

        try:
            load_s = self.load(shape)
        except (InferenceServerException, BuildEnginesError) as exc:
            return Measurement(0.0, 0.0, error=f"load failed: {str(exc).strip().splitlines()[0][:300]}")
        rows = min(load.call_rows or shape.call_rows, shape.max_batch_size)
        measured = offer_load(self.url, self.name, workload, load, rows)
        return Measurement(measured.rows_per_s, measured.p95_ms, measured.error, load_s=load_s)

    def memory(self, instances: int) -> dict[str, int]:
        """RSS of the server and of its children (the python backend's stubs, one per instance), now."""
        children = list(descendants(self.pid))
        server = rss_bytes(self.pid)
        stubs = sum(rss_bytes(pid) for pid in children)
        # A python-backend instance is its own stub process; other backends grow the server itself.
        per_instance = stubs // max(1, instances) if children else max(0, server - self.idle_rss) // max(1, instances)
        return {
            "server_rss_bytes": server,
            "children_rss_bytes": stubs,
            "children": len(children),
            "per_instance_bytes": per_instance,
            # On a CPU server one placed instance runs the config's whole instance group (fleet/placement/).
            "config_bytes": per_instance * max(1, instances),
        }


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def descendants(root: int) -> Iterator[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        yield pid
        pending.extend(children.get(pid, []))

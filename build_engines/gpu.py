"""Finding out, without crashing, whether this machine can build TensorRT plans.

Each probe is guarded: on a CPU-only host NVML is missing, nvidia-smi is absent, and `import tensorrt`
fails, and none of that may stop export or verify from running.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GpuInfo:
    name: str | None
    compute_capability: str | None  # "9.0"; None when only the device node was seen


def detect_gpu() -> GpuInfo | None:
    return _from_nvml() or _from_nvidia_smi() or (GpuInfo(None, None) if Path("/dev/nvidia0").exists() else None)


def _from_nvml() -> GpuInfo | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - missing module and missing driver raise different types
        return None
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return GpuInfo(name.decode() if isinstance(name, bytes) else name, f"{major}.{minor}")
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _from_nvidia_smi() -> GpuInfo | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = done.stdout.strip().splitlines()[:1]
    if done.returncode != 0 or not first:
        return None
    name, _, cc = first[0].rpartition(",")
    cc = cc.strip()
    return GpuInfo(name.strip() or None, cc if cc.replace(".", "").isdigit() else None)


def tensorrt_available() -> bool:
    try:
        return importlib.util.find_spec("tensorrt") is not None
    except (ImportError, ValueError):
        return False


def cannot_build_reason(gpu: GpuInfo | None, has_tensorrt: bool) -> str | None:
    """One sentence for the operator, or None when a plan can be built."""
    missing = []
    if gpu is None:
        missing.append("no NVIDIA GPU was found (NVML, nvidia-smi and /dev/nvidia0 are all absent)")
    if not has_tensorrt:
        missing.append("the `tensorrt` Python module is not installed")
    if not missing:
        return None
    return f"Cannot build a TensorRT plan here because {' and '.join(missing)}; export and verify still work."

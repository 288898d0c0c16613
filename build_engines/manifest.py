"""manifest.json beside every artefact: what was built, from which spec, with which tools, and how well it
matched torch. Timestamps are UTC ISO-8601."""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from build_engines.gpu import GpuInfo
from build_engines.spec import ModelSpec

MANIFEST = "manifest.json"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tool_versions() -> dict[str, str | None]:
    def version(dist: str, *alternatives: str) -> str | None:
        for name in (dist, *alternatives):
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "onnx": version("onnx"),
        "onnxruntime": version("onnxruntime", "onnxruntime-gpu"),
        # NVIDIA publishes the Python bindings under several distribution names.
        "tensorrt": version("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11", "tensorrt_cu12_bindings"),
    }


def shapes(spec: ModelSpec) -> dict[str, Any]:
    def profile_of(shape: tuple[int | str, ...]) -> dict[str, list[int]]:
        return {level: list(spec.concrete_shape(shape, spec.profile[level])) for level in ("min", "opt", "max")}

    return {
        "inputs": {t.name: {"dtype": t.dtype, "dims": list(t.shape), **profile_of(t.shape)} for t in spec.inputs},
        "outputs": {t.name: {"dtype": t.dtype, "dims": list(t.shape)} for t in spec.outputs},
    }


def write_manifest(
    artefact: Path,
    spec: ModelSpec,
    *,
    kind: str,
    precision: str,
    command: str,
    gpu: GpuInfo | None = None,
    parity: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    stamp = now()
    manifest = {
        "artefact": artefact.name,
        "kind": kind,
        "sha256": sha256_file(artefact),
        "bytes": artefact.stat().st_size,
        "model": spec.name,
        "spec": {"path": str(spec.path), "sha256": spec.sha256},
        "opset": spec.opset,
        "precision": precision,
        "shapes": shapes(spec),
        "versions": tool_versions(),
        "gpu_name": gpu.name if gpu else None,
        "compute_capability": gpu.compute_capability if gpu else None,
        "parity": parity,
        "created_at": stamp,
        "updated_at": stamp,
        "command": command,
        **(extra or {}),
    }
    path = artefact.parent / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
    return path


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    return json.loads(path.read_text("utf-8")) if path.is_file() else None


def record_parity(directory: Path, parity: dict[str, Any], command: str) -> None:
    manifest = read_manifest(directory)
    if manifest is None:
        return
    manifest["parity"] = parity
    manifest["updated_at"] = now()
    manifest["verify_command"] = command
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")

"""Triton model folders from a spec: <name>_onnx (onnxruntime backend), <name>_trt (tensorrt_plan) and,
for text models, <name>_ort (python backend serving the same ONNX file, for the pip-bundled tritonserver).

Configs are built as Triton's own ModelConfig protobuf and printed with text_format, so what we write is
valid by construction, and deterministic (no timestamps) so re-emitting an unchanged spec changes nothing
in git. Artefacts are copied in when they exist; the configs are written either way.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from build_engines.export import onnx_path
from build_engines.manifest import MANIFEST, read_manifest
from build_engines.spec import ModelSpec, OutputSpec
from build_engines.trt_build import PLAN_FILE, copy_plan_for_triton, plan_dir, plan_filename

if TYPE_CHECKING:
    from build_engines.generation_spec import GenerationSpec

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS_DIR = REPO_ROOT / "triton_models"
TEMPLATE = Path(__file__).resolve().parent / "templates" / "ort_model.py"
VERSION = "1"
_TRITON_TYPES = {"int32": "TYPE_INT32", "int64": "TYPE_INT64", "fp16": "TYPE_FP16", "fp32": "TYPE_FP32"}


def emit_models(spec: ModelSpec, out_dir: Path, models_dir: Path, *, echo: Callable[[str], None] = print) -> list[Path]:
    onnx_file = onnx_path(out_dir)
    have_onnx = onnx_file.is_file()
    if not have_onnx:
        echo(f"note: {onnx_file} does not exist yet; writing configs only (run export to add the model files)")
    folders = []

    onnx_dir = _model_dir(models_dir, f"{spec.name}_onnx")
    write_config(onnx_dir, spec, _tensor_config(spec, f"{spec.name}_onnx", backend="onnxruntime"))
    _copy_onnx(onnx_file, onnx_dir / VERSION, have_onnx)
    folders.append(onnx_dir)

    trt_dir = _model_dir(models_dir, f"{spec.name}_trt")
    config = _tensor_config(spec, f"{spec.name}_trt", platform="tensorrt_plan", kind="KIND_GPU")
    for cc in spec.triton.compute_capabilities:
        config.cc_model_filenames[cc] = plan_filename(cc)
    write_config(trt_dir, spec, config)
    _keep_version_dir(trt_dir / VERSION)
    built = plan_dir(out_dir, spec.triton.trt_precision) / PLAN_FILE
    plan_manifest = read_manifest(built.parent) if built.is_file() else None
    if plan_manifest and plan_manifest.get("compute_capability"):
        copy_plan_for_triton(built, trt_dir / VERSION, plan_manifest["compute_capability"])
        shutil.copy2(built.parent / MANIFEST, trt_dir / VERSION / MANIFEST)
    else:
        echo(f"note: no {spec.triton.trt_precision} plan in {built.parent}; {trt_dir.name} has its config only")
    folders.append(trt_dir)

    if spec.text is not None:
        ort_dir = _model_dir(models_dir, f"{spec.name}_ort")
        write_config(ort_dir, spec, _text_config(spec, f"{spec.name}_ort"))
        (ort_dir / VERSION).mkdir(exist_ok=True)
        shutil.copy2(TEMPLATE, ort_dir / VERSION / "model.py")
        _copy_onnx(onnx_file, ort_dir / VERSION, have_onnx, keep=False)
        folders.append(ort_dir)
    return folders


def _model_dir(models_dir: Path, name: str) -> Path:
    path = models_dir / name
    (path / VERSION).mkdir(parents=True, exist_ok=True)
    return path


def _keep_version_dir(version_dir: Path) -> None:
    # The artefacts in here are gitignored; without a tracked file a fresh clone would lose the version
    # folder and Triton would refuse the model for having no versions at all.
    (version_dir / ".gitkeep").touch()


def _copy_onnx(onnx_file: Path, version_dir: Path, have_onnx: bool, keep: bool = True) -> None:
    if keep:
        _keep_version_dir(version_dir)
    if have_onnx:
        shutil.copy2(onnx_file, version_dir / "model.onnx")
        if (onnx_file.parent / MANIFEST).is_file():
            shutil.copy2(onnx_file.parent / MANIFEST, version_dir / MANIFEST)


def _base_config(spec: ModelSpec, name: str, kind: str | None) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    config = pb.ModelConfig(name=name, max_batch_size=spec.triton.max_batch_size)
    group = config.instance_group.add()
    group.count = spec.triton.instance_count
    if kind:
        group.kind = pb.ModelInstanceGroup.Kind.Value(kind)
    batching = spec.triton.dynamic_batching
    if batching is not None and spec.triton.max_batch_size > 0:
        config.dynamic_batching.preferred_batch_size.extend(batching.preferred_batch_size)
        config.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_microseconds
    return config


def _triton_dims(spec: ModelSpec, shape: tuple[int | str, ...]) -> list[int]:
    # With batching on, Triton's batch axis is implicit; named (dynamic) axes become -1.
    dims = shape[1:] if spec.triton.max_batch_size > 0 else shape
    return [d if isinstance(d, int) else -1 for d in dims]


def _tensor_config(
    spec: ModelSpec, name: str, *, backend: str = "", platform: str = "", kind: str | None = None
) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    config = _base_config(spec, name, kind)
    if backend:
        config.backend = backend
    if platform:
        config.platform = platform
    for tensor in spec.inputs:
        entry = config.input.add(name=tensor.name, data_type=pb.DataType.Value(_TRITON_TYPES[tensor.dtype]))
        entry.dims.extend(_triton_dims(spec, tensor.shape))
    _add_outputs(spec, config, spec.outputs)
    return config


def _add_outputs(spec: ModelSpec, config: Any, outputs: tuple[OutputSpec, ...]) -> None:
    from tritonclient.grpc import model_config_pb2 as pb

    for tensor in outputs:
        entry = config.output.add(name=tensor.name, data_type=pb.DataType.Value(_TRITON_TYPES[tensor.dtype]))
        entry.dims.extend(_triton_dims(spec, tensor.shape))


def _text_config(spec: ModelSpec, name: str) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    assert spec.text is not None
    config = _base_config(spec, name, None)
    config.backend = "python"
    text = config.input.add(name="TEXT", data_type=pb.TYPE_STRING)
    text.dims.append(1)
    _add_outputs(spec, config, spec.outputs[:1])
    tokens = config.output.add(name="TOKENS", data_type=pb.TYPE_INT32)
    tokens.dims.append(1)
    parameters = {
        "model_dir_from": spec.text.model_dir,
        "max_length": str(spec.text.max_length),
        "onnx_inputs": ",".join(t.name for t in spec.inputs),
        "onnx_output": spec.outputs[0].name,
        "onnx_file": "model.onnx",
    }
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return config


def write_config(model_dir: Path, spec: ModelSpec | GenerationSpec, config: Any) -> None:
    """config.pbtxt with a header naming the spec it came from (both spec kinds carry path and sha256)."""
    from google.protobuf import text_format

    try:
        spec_name = spec.path.relative_to(REPO_ROOT)
    except ValueError:
        spec_name = Path(spec.path.name)
    header = (
        f"# Generated by `python -m build_engines emit {spec_name}`; edit the spec, not this file.\n"
        f"# Spec sha256 {spec.sha256}\n"
    )
    (model_dir / "config.pbtxt").write_text(header + text_format.MessageToString(config), "utf-8")

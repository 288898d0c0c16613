"""torch -> ONNX, with the dynamic axes and opset the spec declares."""

from __future__ import annotations

import warnings
from pathlib import Path

from build_engines.errors import SpecError
from build_engines.gpu import detect_gpu
from build_engines.manifest import write_manifest
from build_engines.model_io import NUMPY_DTYPES, example_inputs, load_source
from build_engines.spec import ModelSpec

ONNX_DIR = "onnx"
ONNX_FILE = "model.onnx"
_ONNX_ELEM = {"int32": 6, "int64": 7, "fp16": 10, "fp32": 1}  # onnx.TensorProto enum values


def onnx_path(out_dir: Path) -> Path:
    return out_dir / ONNX_DIR / ONNX_FILE


def export_onnx(spec: ModelSpec, out_dir: Path, *, command: str) -> Path:
    import onnx
    import torch

    model = load_source(spec)
    feeds = example_inputs(spec)
    args = tuple(torch.from_numpy(feeds[t.name]) for t in spec.inputs)
    dynamic_axes = {
        tensor.name: {axis: dim for axis, dim in enumerate(tensor.shape) if isinstance(dim, str)}
        for tensor in (*spec.inputs, *spec.outputs)
    }
    target = onnx_path(out_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".onnx.partial")
    try:
        with warnings.catch_warnings():
            # The TorchScript exporter warns on every Python-level shape branch it freezes; verify runs the
            # graph at the profile's min/opt/max shapes, which is what actually catches a frozen shape.
            warnings.simplefilter("ignore")
            # dynamo=False: the torch.export-based exporter needs onnxscript, which this project does not
            # install; the TorchScript exporter is still supported in torch 2.x and handles these models.
            torch.onnx.export(
                model,
                args,
                str(partial),
                input_names=[t.name for t in spec.inputs],
                output_names=[t.name for t in spec.outputs],
                dynamic_axes=dynamic_axes,
                opset_version=spec.opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:  # the exporter raises many unrelated types; all mean "fix the spec"
        partial.unlink(missing_ok=True)
        raise _export_error(spec, exc) from exc
    partial.replace(target)  # atomic: a crash never leaves a half-written model.onnx that looks valid

    try:
        onnx.checker.check_model(str(target), full_check=True)
    except Exception as exc:  # checker raises ValidationError or InferenceError
        raise SpecError(spec.path, [("opset", f"the exported graph fails onnx.checker: {_first_line(exc)}")]) from exc
    _check_graph_io(spec, onnx.load(str(target), load_external_data=False))
    # The graph is device-neutral; the GPU (if any) is recorded to describe the machine that exported it.
    write_manifest(target, spec, kind="onnx", precision="fp32", command=command, gpu=detect_gpu())
    return target


def _export_error(spec: ModelSpec, exc: Exception) -> SpecError:
    text = f"{type(exc).__name__}: {_first_line(exc)}"
    lowered = text.lower()
    if "unsupported" in lowered or "not supported" in lowered or "opset" in lowered:
        return SpecError(
            spec.path,
            [
                (
                    "opset",
                    f"torch.onnx.export cannot express an operator at opset "
                    f"{spec.opset} ({text}); raise opset (at most 21) or change the "
                    f"model that source={spec.source!r} builds",
                )
            ],
        )
    return SpecError(spec.path, [("source", f"torch.onnx.export failed for {spec.source!r}: {text}")])


def _check_graph_io(spec: ModelSpec, graph_model: object) -> None:
    graph = graph_model.graph  # type: ignore[attr-defined]
    initializers = {init.name for init in graph.initializer}
    graph_inputs = {i.name: i for i in graph.input if i.name not in initializers}
    problems = []
    for i, tensor in enumerate(spec.inputs):
        found = graph_inputs.get(tensor.name)
        if found is None:
            # The TorchScript exporter silently drops inputs the forward never reads.
            problems.append(
                (
                    f"inputs[{i}].name",
                    f"the exported graph has no input {tensor.name!r}: the model ignores it; remove it from the spec",
                )
            )
        elif found.type.tensor_type.elem_type != _ONNX_ELEM[tensor.dtype]:
            problems.append(
                (
                    f"inputs[{i}].dtype",
                    f"the graph takes ONNX element type "
                    f"{found.type.tensor_type.elem_type} for {tensor.name!r}, "
                    f"not {tensor.dtype}",
                )
            )
    for i, tensor in enumerate(spec.outputs):
        out = next((o for o in graph.output if o.name == tensor.name), None)
        if out is not None and out.type.tensor_type.elem_type != _ONNX_ELEM[tensor.dtype]:
            problems.append(
                (
                    f"outputs[{i}].dtype",
                    f"the graph returns element type "
                    f"{out.type.tensor_type.elem_type} for {tensor.name!r}, "
                    f"not {tensor.dtype} ({NUMPY_DTYPES[tensor.dtype].__name__})",
                )
            )
    if problems:
        raise SpecError(spec.path, problems)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

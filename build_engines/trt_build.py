"""ONNX -> TensorRT plan with the tensorrt Python API, then parity of the plan against torch on the GPU.

Only runs where an NVIDIA GPU and the `tensorrt` module are both present; elsewhere it raises
CannotRunHere with one sentence, which `all` reports without failing (unless --require-trt).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from build_engines.errors import CannotRunHere, MissingArtefact, SpecError, VerifyFailed
from build_engines.export import onnx_path
from build_engines.gpu import cannot_build_reason, detect_gpu, tensorrt_available
from build_engines.manifest import record_parity, write_manifest
from build_engines.model_io import Feeds, load_source, torch_outputs
from build_engines.spec import ModelSpec
from build_engines.verify import failure_message, format_table, parity_cases, run_parity, summarise

PLAN_FILE = "model.plan"


def plan_dir(out_dir: Path, precision: str) -> Path:
    return out_dir / f"trt-{precision}"


def build_plans(
    spec: ModelSpec,
    out_dir: Path,
    *,
    command: str,
    precisions: list[str] | None = None,
    seed: int = 0,
    echo: Callable[[str], None] = print,
) -> list[Path]:
    gpu = detect_gpu()
    reason = cannot_build_reason(gpu, tensorrt_available())
    if reason:
        raise CannotRunHere(reason)
    source = onnx_path(out_dir)
    if not source.is_file():
        raise MissingArtefact(f"no ONNX model at {source}; run `python -m build_engines export {spec.path}` first")
    import tensorrt as trt

    built = []
    for precision in precisions or list(spec.precisions):
        if precision not in spec.precisions:
            raise SpecError(spec.path, [("precisions", f"--precision {precision} is not listed in precisions")])
        target = plan_dir(out_dir, precision) / PLAN_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        echo(f"building {precision} TensorRT plan for {spec.name} (TensorRT {trt.__version__}) ...")
        plan = _build_serialized(trt, spec, source, precision)
        partial = target.with_suffix(".plan.partial")
        partial.write_bytes(plan)
        partial.replace(target)
        write_manifest(target, spec, kind="tensorrt_plan", precision=precision, command=command, gpu=gpu)
        summary = _plan_parity(trt, spec, plan, precision, seed, echo)
        if summary is not None:
            record_parity(target.parent, summary, command)
            if not summary["passed"]:
                raise VerifyFailed(failure_message(spec, precision, summary, "tensorrt"))
        built.append(target)
    return built


def _build_serialized(trt: Any, spec: ModelSpec, source: Path, precision: str) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # TensorRT 10 networks are always explicit-batch and the flag is gone; 8.x still needs it.
    flag = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    network = builder.create_network(0 if flag is None or _major(trt) >= 10 else 1 << int(flag))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(source)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SpecError(
            spec.path,
            [
                (
                    "opset",
                    f"TensorRT's ONNX parser rejects the exported graph ({errors}); "
                    "change opset or the model that source builds",
                )
            ],
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_mib << 20)
    profile = builder.create_optimization_profile()
    for tensor in spec.inputs:
        profile.set_shape(tensor.name, *(spec.shape_at(tensor, level) for level in ("min", "opt", "max")))
    config.add_optimization_profile(profile)
    if precision == "fp16":
        # platform_has_fast_fp16 is deprecated in TensorRT 10 and may be gone; every GPU it supports has FP16.
        if not getattr(builder, "platform_has_fast_fp16", True):
            raise CannotRunHere(
                "Cannot build an fp16 plan here because this GPU has no fast FP16; build fp32 with --precision fp32."
            )
        config.set_flag(trt.BuilderFlag.FP16)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SpecError(
            spec.path,
            [
                (
                    "trt.workspace_mib",
                    "TensorRT could not build an engine (see its log "
                    "above); a larger workspace or a smaller profile.max "
                    "usually fixes it",
                )
            ],
        )
    return bytes(plan)


def _plan_parity(
    trt: Any, spec: ModelSpec, plan: bytes, precision: str, seed: int, echo: Callable[[str], None]
) -> dict[str, Any] | None:
    """Run the fresh plan through torch-owned CUDA buffers (no pycuda needed) and compare against torch."""
    import torch

    if not torch.cuda.is_available():
        echo("plan parity skipped: this torch build has no CUDA, so there is nothing to hold the plan's buffers")
        return None
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan)
    context = engine.create_execution_context()
    torch_dtypes = {"int32": torch.int32, "int64": torch.int64, "fp16": torch.float16, "fp32": torch.float32}

    def run_plan(feeds: Feeds) -> list[np.ndarray]:
        keep = []
        for tensor in spec.inputs:
            device = torch.from_numpy(feeds[tensor.name]).to("cuda").contiguous()
            keep.append(device)
            context.set_input_shape(tensor.name, tuple(device.shape))
            context.set_tensor_address(tensor.name, device.data_ptr())
        outputs = []
        for tensor in spec.outputs:
            out = torch.empty(
                tuple(context.get_tensor_shape(tensor.name)), dtype=torch_dtypes[tensor.dtype], device="cuda"
            )
            context.set_tensor_address(tensor.name, out.data_ptr())
            outputs.append(out)
        stream = torch.cuda.current_stream()
        if not context.execute_async_v3(stream.cuda_stream):
            raise VerifyFailed(f"TensorRT failed to execute the {precision} plan")
        stream.synchronize()
        return [o.float().cpu().numpy() for o in outputs]

    model = load_source(spec)
    results = run_parity(
        spec,
        parity_cases(spec, seed),
        lambda feeds: torch_outputs(spec, model, feeds),
        run_plan,
        spec.tolerance[precision],
    )
    echo(format_table(results))
    return summarise(spec, precision, results, seed, "tensorrt")


def _major(trt: Any) -> int:
    head = str(getattr(trt, "__version__", "0")).split(".")[0]
    return int(head) if head.isdigit() else 0


def copy_plan_for_triton(plan: Path, version_dir: Path, compute_capability: str) -> Path:
    """Triton picks `cc_model_filenames[<local cc>]`, so the file name carries the capability it was built on."""
    target = version_dir / plan_filename(compute_capability)
    shutil.copy2(plan, target)
    return target


def plan_filename(compute_capability: str) -> str:
    return f"model_sm{compute_capability.replace('.', '')}.plan"

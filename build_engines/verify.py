"""Parity: a candidate runtime (ONNX Runtime CPU here, TensorRT on a GPU host) against torch.

Cases: fresh random inputs at the profile's min, opt and max shapes, any extra shapes asked for, and the
spec's real corpus tokenised with the model's own tokenizer. Relative error is per row,
||candidate - torch|| / ||torch||, because element-wise relative error explodes on the many embedding
components that sit near zero and would fail every model for no real difference.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from build_engines.errors import MissingArtefact, SpecError, VerifyFailed
from build_engines.export import onnx_path
from build_engines.manifest import now, read_manifest, record_parity
from build_engines.model_io import Feeds, corpus_batches, load_source, load_tokenizer, random_inputs, torch_outputs
from build_engines.spec import ModelSpec, Tolerance

Runner = Callable[[Feeds], list[np.ndarray]]


@dataclass(frozen=True)
class CaseResult:
    case: str
    shape: str
    max_abs: float
    max_rel: float
    min_cosine: float
    passed: bool


def parity_cases(
    spec: ModelSpec, seed: int, extra_sizes: list[dict[str, int]] | None = None, corpus: bool = True
) -> list[tuple[str, Feeds]]:
    rng = np.random.default_rng(seed)
    cases = [(f"random {level}", random_inputs(spec, spec.profile[level], rng)) for level in ("min", "opt", "max")]
    for sizes in extra_sizes or []:
        full = {**spec.profile["opt"], **sizes}
        spec.check_axis_sizes(full)
        label = ",".join(f"{k}={v}" for k, v in sizes.items())
        cases.append((f"random {label}", random_inputs(spec, full, rng)))
    if corpus and spec.text is not None:
        batch_axis = spec.inputs[0].shape[0]
        # Corpus batches at the profile's largest batch: the size a busy server runs, and fewer calls.
        batch = spec.profile["max"][batch_axis] if isinstance(batch_axis, str) else 1
        tokenizer = load_tokenizer(spec)
        for start, feeds in corpus_batches(spec, tokenizer, batch):
            cases.append((f"corpus lines {start + 1}-{start + len(next(iter(feeds.values())))}", feeds))
    return cases


def compare(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float, float]:
    ref = reference.astype(np.float64).reshape(reference.shape[0], -1) if reference.ndim else reference.reshape(1, 1)
    got = candidate.astype(np.float64).reshape(ref.shape)
    diff = got - ref
    ref_norm = np.linalg.norm(ref, axis=1)
    got_norm = np.linalg.norm(got, axis=1)
    rel = np.linalg.norm(diff, axis=1) / np.maximum(ref_norm, 1e-12)
    cosine = np.sum(ref * got, axis=1) / np.maximum(ref_norm * got_norm, 1e-12)
    # Two all-zero rows (e.g. an all-padding input) agree perfectly; cosine is undefined there.
    cosine = np.where((ref_norm < 1e-12) & (got_norm < 1e-12), 1.0, cosine)
    return float(np.abs(diff).max(initial=0.0)), float(rel.max(initial=0.0)), float(cosine.min(initial=1.0))


def run_parity(
    spec: ModelSpec, cases: list[tuple[str, Feeds]], reference: Runner, candidate: Runner, tolerance: Tolerance
) -> list[CaseResult]:
    results = []
    for label, feeds in cases:
        expected, got = reference(feeds), candidate(feeds)
        worst = (0.0, 0.0, 1.0)
        for i, (ref, out) in enumerate(zip(expected, got, strict=True)):
            want = spec.concrete_shape(spec.outputs[i].shape, _sizes_of(spec, feeds))
            if tuple(out.shape) != want or ref.shape != out.shape:
                raise SpecError(
                    spec.path,
                    [
                        (
                            f"outputs[{i}].shape",
                            f"the model returns {list(out.shape)} "
                            f"(torch: {list(ref.shape)}) for case "
                            f"{label!r}, the spec says {list(want)}",
                        )
                    ],
                )
            abs_err, rel_err, cosine = compare(ref, out)
            worst = (max(worst[0], abs_err), max(worst[1], rel_err), min(worst[2], cosine))
        passed = (
            worst[0] <= tolerance.max_abs
            and worst[2] >= tolerance.min_cosine
            and (tolerance.max_rel is None or worst[1] <= tolerance.max_rel)
        )
        shape = "x".join(str(d) for d in next(iter(feeds.values())).shape)
        results.append(CaseResult(label, shape, *worst, passed=passed))
    return results


def _sizes_of(spec: ModelSpec, feeds: Feeds) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for tensor in spec.inputs:
        for dim, actual in zip(tensor.shape, feeds[tensor.name].shape, strict=True):
            if isinstance(dim, str):
                sizes[dim] = actual
    return sizes


def summarise(spec: ModelSpec, precision: str, results: list[CaseResult], seed: int, runtime: str) -> dict[str, Any]:
    tolerance = spec.tolerance[precision]
    return {
        "runtime": runtime,
        "precision": precision,
        "seed": seed,
        "tolerance": asdict(tolerance),
        "max_abs": max(r.max_abs for r in results),
        "max_rel": max(r.max_rel for r in results),
        "min_cosine": min(r.min_cosine for r in results),
        "passed": all(r.passed for r in results),
        "cases": [asdict(r) for r in results],
        "verified_at": now(),
    }


def format_table(results: list[CaseResult]) -> str:
    header = f"{'case':<24} {'shape':>9} {'max_abs':>10} {'max_rel':>10} {'min_cos':>10}  ok"
    rows = [
        f"{r.case:<24} {r.shape:>9} {r.max_abs:>10.3e} {r.max_rel:>10.3e} {r.min_cosine:>10.7f}  "
        f"{'yes' if r.passed else 'NO'}"
        for r in results
    ]
    return "\n".join([header, *rows])


def failure_message(spec: ModelSpec, precision: str, summary: dict[str, Any], runtime: str) -> str:
    tol = spec.tolerance[precision]
    over = []
    if summary["max_abs"] > tol.max_abs:
        over.append(f"max_abs {summary['max_abs']:.3e} > tolerance.{precision}.max_abs {tol.max_abs:.3e}")
    if tol.max_rel is not None and summary["max_rel"] > tol.max_rel:
        over.append(f"max_rel {summary['max_rel']:.3e} > tolerance.{precision}.max_rel {tol.max_rel:.3e}")
    if summary["min_cosine"] < tol.min_cosine:
        over.append(f"min_cosine {summary['min_cosine']:.7f} < tolerance.{precision}.min_cosine {tol.min_cosine}")
    return f"verify failed: {runtime} vs torch for {spec.name} ({precision}): " + "; ".join(over)


def verify_onnx(
    spec: ModelSpec,
    out_dir: Path,
    *,
    command: str,
    seed: int | None = None,
    extra_sizes: list[dict[str, int]] | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    import onnxruntime as ort

    model_path = onnx_path(out_dir)
    if not model_path.is_file():
        raise MissingArtefact(f"no ONNX model at {model_path}; run `python -m build_engines export {spec.path}` first")
    manifest = read_manifest(model_path.parent)
    if manifest and manifest.get("spec", {}).get("sha256") != spec.sha256:
        echo(f"warning: {spec.path.name} changed since {model_path} was exported; re-export if inputs changed")
    seed = secrets.randbelow(2**31) if seed is None else seed  # fresh inputs every run; the seed replays them
    cases = parity_cases(spec, seed, extra_sizes)  # before loading torch: a bad --shape fails fast
    model = load_source(spec)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # ORT's idle threads spin between runs; on a small CPU they starve the torch reference that runs next.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [t.name for t in spec.outputs]
    # The ONNX file is FP32; a spec that only lists fp16 (for TensorRT) is held to its fp16 tolerance here.
    precision = "fp32" if "fp32" in spec.tolerance else spec.precisions[0]
    results = run_parity(
        spec,
        cases,
        lambda feeds: torch_outputs(spec, model, feeds),
        lambda feeds: [np.asarray(o) for o in session.run(names, feeds)],
        spec.tolerance[precision],
    )
    summary = summarise(spec, precision, results, seed, "onnxruntime-cpu")
    echo(format_table(results))
    echo(
        f"seed {seed}: max_abs {summary['max_abs']:.3e}  max_rel {summary['max_rel']:.3e}  "
        f"min_cosine {summary['min_cosine']:.7f}  -> {'PASS' if summary['passed'] else 'FAIL'}"
    )
    record_parity(model_path.parent, summary, command)
    if not summary["passed"]:
        raise VerifyFailed(failure_message(spec, precision, summary, "onnxruntime-cpu"))
    return summary

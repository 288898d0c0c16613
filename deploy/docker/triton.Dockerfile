# Triton for GPU hosts: the NGC image plus what the python-backend models in triton_models/ import.
#
# Why a Dockerfile on top of NGC rather than native backends only: the embeddings endpoint sends *text*, and
# the catalogue's text model (`minilm`, and `minilm_ort` from build_engines) tokenizes inside Triton
# (TEXT in, EMBEDDING and TOKENS out); the TOKENS output is what the usage ledger and the scheduler's work
# units are corrected with. The native backends (onnxruntime, tensorrt_plan) take token ids only, so a
# native-only host would need tokenizing in the control plane, which nothing there does. This image keeps
# the native backends too: build_engines' `minilm_onnx` (onnxruntime) and `minilm_trt` (tensorrt_plan)
# models load from the same repository for tenants of the tensor endpoint, without Python in the path.
#
# The base must run Python 3.12 (NGC 25.01 and later are Ubuntu 24.04 / Python 3.12): 24.xx images run
# Python 3.10, for which transformers 5.24 and onnxruntime-gpu 1.31 have no wheels.
# Build from the repository root: docker build -f deploy/docker/triton.Dockerfile -t controlplane-triton .
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.10-py3
FROM ${TRITON_IMAGE}

# curl: the health check (compose) and the PreStop drain call (deploy/k8s) run inside this container.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

# Ubuntu 24.04 marks the system Python externally managed; this image is that Python's only user.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY deploy/docker/triton-requirements.txt /tmp/triton-requirements.txt
RUN pip install -r /tmp/triton-requirements.txt

# The model repository is a volume (compose) or a volume/PVC (k8s) at /models, not baked in: engines are
# built per GPU generation by build_engines and models change without rebuilding this image.
# Explicit model control: only the control plane's reconciler loads and unloads models.
CMD ["tritonserver", "--model-repository=/models", "--model-control-mode=explicit", \
     "--exit-timeout-secs=30", "--allow-metrics=true", "--allow-gpu-metrics=true"]

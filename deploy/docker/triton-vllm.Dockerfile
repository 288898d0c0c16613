# Triton for the `llm` GPU pool: NGC's Triton image with the vLLM backend, serving the generation models
# build_engines emits as <name>_vllm (config.pbtxt + 1/model.json; build_engines/README.md, "Generation models").
#
# Why the same release as triton.Dockerfile (25.10): one Triton server version across the fleet, so the
# control plane's clients, the reconciler's load-with-config-override and the metrics it parses behave the
# same on every pool; and 25.10 is a Python 3.12 image like the other. NVIDIA's vLLM container of the same
# release carries vLLM 0.10.2; the model.json keys build_engines writes are fields of vLLM's engine
# arguments from v0.7 through the v0.11 line (build_engines/vendored/README.md), so they hold for it.
# Nothing is pip-installed on top: the image's vLLM, torch and transformers are built for each other, and
# the vLLM backend needs no project code (the service applies chat templates and sends text).
# Build from the repository root: docker build -f deploy/docker/triton-vllm.Dockerfile -t controlplane-triton-vllm .
ARG TRITON_VLLM_IMAGE=nvcr.io/nvidia/tritonserver:25.10-vllm-python-py3
FROM ${TRITON_VLLM_IMAGE}

# curl: the health check (compose) and the PreStop drain call (deploy/k8s) run inside this container.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

# No Hugging Face hub at serve time: the weights are a volume (/weights) or inside the model repository.
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# The model repository is a volume at /models; explicit model control: only the reconciler loads models
# (the vLLM backend's health check, ENABLE_VLLM_HEALTH_CHECK in the emitted configs, requires it too).
CMD ["tritonserver", "--model-repository=/models", "--model-control-mode=explicit", \
     "--exit-timeout-secs=30", "--allow-metrics=true", "--allow-gpu-metrics=true"]

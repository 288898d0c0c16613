"""The compose file is valid against the compose spec's JSON schema (vendored, deploy/schemas/SOURCES.md),
a broken one is not, and it runs what docs/architecture/README.md's "Processes" lists, with the GPU reservation
and explicit model control on Triton; the images' requirement files agree with requirements.txt."""

from __future__ import annotations

import copy
import re

import yaml

from controlplane.core.messaging.queues import QUEUES
from tests.deploy.manifests import DEPLOY, REPO, compose_errors, compose_file


def test_the_compose_file_is_valid():
    assert compose_errors(compose_file()) == []


def test_a_broken_compose_file_fails_validation():
    broken = copy.deepcopy(compose_file())
    broken["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"][0].pop("capabilities")
    assert any("capabilities" in e for e in compose_errors(broken))
    broken = copy.deepcopy(compose_file())
    broken["services"]["web"]["restart_policy"] = "always"  # not a service key (deploy.restart_policy is)
    assert any("restart_policy" in e for e in compose_errors(broken))
    broken = copy.deepcopy(compose_file())
    broken["services"]["web"]["depends_on"] = {"migrate": {"condition": "when_ready"}}
    assert compose_errors(broken)


def test_compose_runs_every_process_with_gpu_triton_and_monitoring():
    services = compose_file()["services"]
    assert {"web", "worker-control", "worker-validation", "worker-housekeeping", "worker-shards", "worker-webhooks",
            "beat", "migrate", "postgres", "redis", "triton", "triton-register", "prometheus", "grafana"} <= set(services)  # fmt: skip
    queues = {s["command"][s["command"].index("-Q") + 1] for n, s in services.items() if n.startswith("worker-")}
    assert queues == set(QUEUES)
    # Validation parses on processes; housekeeping is beat's jobs alone.
    assert "prefork" in services["worker-validation"]["command"]
    triton = services["triton"]
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "--model-control-mode=explicit" in triton["command"]
    assert any(v.endswith(":/models:ro") for v in triton["volumes"])
    assert triton["build"]["dockerfile"] == "deploy/docker/triton.Dockerfile"
    assert services["beat"]["command"][:3] == ["python", "-m", "deploy.singleton"]
    assert services["web"]["environment"]["METRICS_DB_GAUGES"] == "1"
    # Only web computes the database gauges (docs/operations/metrics.md: exactly one process).
    assert [n for n, s in services.items() if "METRICS_DB_GAUGES" in (s.get("environment") or {})] == ["web"]
    # Every path the file mounts from the repository exists.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", volume.split(":")[0])
            if source.startswith("."):
                assert (DEPLOY / "compose" / source).resolve().exists(), source


def test_prometheus_scrapes_every_process_that_counts():
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {t for job in jobs.values() for group in job["static_configs"] for t in group["targets"]}
    workers = {f"worker-{queue}:9100" for queue in QUEUES}
    assert targets == {"web:8000", "triton:8002", *workers}
    assert jobs["controlplane-web"]["authorization"]["credentials_file"] == "/run/secrets/metrics_token"
    env_example = (DEPLOY / "compose" / ".env.example").read_text()
    required = set(re.findall(r"\$\{([A-Z_]+):\?", (DEPLOY / "compose" / "compose.yaml").read_text()))
    for name in required:
        assert re.search(rf"^{name}=", env_example, flags=re.MULTILINE), name


def _pins(path):
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version
    return pins


def test_image_requirements_pin_what_requirements_txt_pins():
    project = _pins(REPO / "requirements.txt")
    runtime = _pins(DEPLOY / "docker" / "requirements-runtime.txt")
    assert runtime and all(project.get(name) == version for name, version in runtime.items()), runtime
    triton = _pins(DEPLOY / "docker" / "triton-requirements.txt")
    # onnxruntime-gpu is the GPU build of requirements.txt's CPU onnxruntime: the one name only here.
    assert {n: v for n, v in triton.items() if project.get(n) != v} == {"onnxruntime-gpu": triton["onnxruntime-gpu"]}


def test_dockerfiles_copy_only_what_exists():
    # No Docker engine here: the build context is the repository root, so every COPY source must exist.
    for dockerfile in ("Dockerfile", "triton.Dockerfile"):
        text = (DEPLOY / "docker" / dockerfile).read_text()
        copies = re.findall(r"^COPY\s+(.+)$", text, flags=re.MULTILINE)
        assert copies, dockerfile
        for line in copies:
            *sources, _destination = line.split()
            for source in sources:
                assert (REPO / source).exists(), (dockerfile, source)


def test_the_llm_pool_runs_the_vllm_image_on_tensor_parallel_gpus_when_asked():
    services = compose_file()["services"]
    llm, register = services["triton-llm"], services["triton-llm-register"]
    # Off by default (it needs weights); on with --profile llm, registered in pool "llm".
    assert llm["profiles"] == register["profiles"] == ["llm"]
    assert llm["build"]["dockerfile"] == "deploy/docker/triton-vllm.Dockerfile"
    assert "--model-control-mode=explicit" in llm["command"]
    (device,) = llm["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == "${LLM_GPUS:-2}"
    assert llm["shm_size"].endswith("gb}")  # NCCL between the ranks of one instance
    assert any(v.endswith(":/models:ro") for v in llm["volumes"])
    assert any(v.endswith(":/weights:ro") for v in llm["volumes"])
    command = register["command"]
    assert command[command.index("--pool") + 1] == "llm"
    assert command[command.index("--grpc-url") + 1] == "triton-llm:8001"
    pools = services["web"]["environment"]["FLEET_POOLS"]
    assert ",llm=${LLM_SERVERS:-0}:${LLM_SERVERS:-0}" in pools


def test_the_vllm_image_is_the_same_triton_release_as_the_main_one():
    def base(dockerfile):
        (image,) = re.findall(
            r"^ARG \w+=(nvcr\.io/nvidia/tritonserver:\S+)$",
            (DEPLOY / "docker" / dockerfile).read_text(),
            flags=re.MULTILINE,
        )
        return image.rsplit(":", 1)[1]

    main, vllm = base("triton.Dockerfile"), base("triton-vllm.Dockerfile")
    assert vllm == f"{main.removesuffix('-py3')}-vllm-python-py3", (main, vllm)

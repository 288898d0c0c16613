"""The Kustomize overlays render, every built-in object is valid against Kubernetes' own schemas
(kubernetes-validate), and the CRD objects against the vendored KEDA and Prometheus operator CRDs; the KEDA
trigger metadata uses only keys KEDA reads; and the pieces the fleet depends on are where they must be."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from controlplane.core.messaging.queues import QUEUES
from tests.deploy.manifests import (
    CRDS,
    OVERLAYS,
    crd_errors,
    find,
    render,
    trigger_metadata_errors,
)

# Native sidecars (an init container with restartPolicy Always, the Triton pod's fleet agent) are GA in 1.33.
KUBERNETES_VERSION = "1.33.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_kinds_are_valid_and_only_known_crds_are_left(overlay):
    docs = render(overlay)
    custom = set()
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            custom.add((doc["apiVersion"], doc["kind"]))
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {error.message} at {list(error.path)}")
    assert custom == set(CRDS)  # nothing else escaped validation


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_crd_objects_match_the_vendored_crds_and_keda_keys(overlay):
    docs = [d for d in render(overlay) if (d["apiVersion"], d["kind"]) in CRDS]
    assert {d["kind"] for d in docs} == {"ScaledObject", "TriggerAuthentication", "ServiceMonitor"}
    for doc in docs:
        assert crd_errors(doc) == [], doc["metadata"]["name"]
        if doc["kind"] == "ScaledObject":
            assert trigger_metadata_errors(doc) == [], doc["metadata"]["name"]


def test_a_broken_scaled_object_fails_validation():
    good = find(render("gpu-prod"), "ScaledObject", "triton")
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["minReplicaCount"] = "zero"
    assert any("minReplicaCount" in e for e in crd_errors(wrong_type))
    no_target = copy.deepcopy(good)
    del no_target["spec"]["scaleTargetRef"]
    assert any("scaleTargetRef" in e for e in crd_errors(no_target))
    half_fallback = copy.deepcopy(good)
    del half_fallback["spec"]["fallback"]["replicas"]
    assert any("replicas" in e for e in crd_errors(half_fallback))
    # The CRD types metadata as a free map: a misspelt key passes it, the key check catches it.
    misspelt = copy.deepcopy(good)
    metadata = misspelt["spec"]["triggers"][0]["metadata"]
    metadata["treshold"] = metadata.pop("threshold")
    assert crd_errors(misspelt) == []
    assert trigger_metadata_errors(misspelt) == [
        "prometheus: unknown metadata key 'treshold'",
        "prometheus: missing 'threshold'",
    ]
    unquoted = copy.deepcopy(good)
    unquoted["spec"]["triggers"][0]["metadata"]["threshold"] = 1
    assert any("threshold" in e for e in crd_errors(unquoted) + trigger_metadata_errors(unquoted))


def test_keda_scales_triton_on_the_desired_servers_gauge_and_workers_on_postgres():
    docs = render("gpu-prod")
    triton = find(docs, "ScaledObject", "triton")
    assert triton["spec"]["scaleTargetRef"]["name"] == "triton"
    assert triton["spec"]["minReplicaCount"] == 0  # idle pools scale to zero in production
    (trigger,) = triton["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert "batch_fleet_desired_servers" in trigger["metadata"]["query"]
    assert float(trigger["metadata"]["activationThreshold"]) < 1 <= float(trigger["metadata"]["threshold"])
    workers = find(docs, "ScaledObject", "controlplane-worker-shards")
    (trigger,) = workers["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert trigger["authenticationRef"]["name"] == "controlplane-postgres"
    auth = find(docs, "TriggerAuthentication", "controlplane-postgres")
    assert auth["spec"]["secretTargetRef"][0]["parameter"] == "connection"
    for scaled in (triton, workers):
        assert scaled["spec"]["fallback"]["failureThreshold"] >= 1
        assert scaled["spec"]["cooldownPeriod"] > 0
        find(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])  # the target exists


def _pod(docs, name):
    return find(docs, "Deployment", name)["spec"]["template"]["spec"]


def test_triton_pods_use_gpus_register_themselves_and_drain_before_stopping():
    spec = _pod(render("gpu-prod"), "triton")
    (triton,) = spec["containers"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert "--model-control-mode=explicit" in triton["args"]
    drain = " ".join(triton["lifecycle"]["preStop"]["exec"]["command"])
    assert "/internal/fleet/servers/$POD_NAME/drain?wait=" in drain and "FLEET_TOKEN" in drain
    (agent,) = [c for c in spec["initContainers"] if c["name"] == "fleet-agent"]
    assert agent["restartPolicy"] == "Always"  # a native sidecar: up before Triton, down after it
    register = " ".join(agent["command"])
    assert "manage.py fleet_register --name" in register and "--metrics-url" in register
    assert spec["terminationGracePeriodSeconds"] > 60  # room for the drain
    # The dev overlay runs Triton on CPU.
    dev = _pod(render("dev"), "triton")
    assert "nvidia.com/gpu" not in str(dev["containers"][0]["resources"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_beat_is_one_locked_replica_and_migrations_run_as_a_job(overlay):
    docs = render(overlay)
    beat = find(docs, "Deployment", "controlplane-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert beat["spec"]["template"]["spec"]["containers"][0]["args"][:4] == [
        "python",
        "-m",
        "deploy.singleton",
        "--lock",
    ]
    job = find(docs, "Job", "controlplane-migrate")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["migrate", "--noinput"]
    queues = set()
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"].startswith("controlplane-worker-"):
            args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            queues.add(args[args.index("-Q") + 1])
    assert queues == set(QUEUES)
    pdbs = {d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert {"controlplane-web", "triton", "controlplane-worker-shards"} <= pdbs


def test_every_secret_and_config_reference_resolves_in_dev():
    docs = render("dev")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc in docs:
        text = str(doc)
        if "controlplane-secrets" in text:
            assert any(k == "Secret" and n.startswith("controlplane-secrets-") for k, n in names), "generator"
            # Kustomize rewrote every reference to the generated (hash-suffixed) name.
            assert "'controlplane-secrets'" not in text, doc["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_bounds_agree_with_the_fleet_size_loop_settings(overlay):
    docs = render(overlay)
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("controlplane-config")
    ]
    pools = dict(entry.split("=", 1) for entry in config["data"]["FLEET_POOLS"].split(","))
    triton = find(docs, "ScaledObject", "triton")
    pool = triton["spec"]["triggers"][0]["metadata"]["query"].split('pool="')[1].split('"')[0]
    assert pools[pool] == f"{triton['spec']['minReplicaCount']}:{triton['spec']['maxReplicaCount']}"
    args = _pod(docs, "controlplane-worker-shards")["containers"][0]["args"]
    slots = args[args.index("-c") + 1]
    workers = find(docs, "ScaledObject", "controlplane-worker-shards")
    assert (
        config["data"]["FLEET_WORKER_SLOTS"] == slots == workers["spec"]["triggers"][0]["metadata"]["targetQueryValue"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_reached_by_ip_accept_their_own_address_as_host(overlay):
    # Kubelet probes and Prometheus send `Host: <pod IP>`; Django answers 400 to a host it does not allow.
    for name in ("controlplane-web", "controlplane-metrics"):
        env = _pod(render(overlay), name)["containers"][0]["env"]
        names = [e["name"] for e in env]
        assert names.index("POD_IP") < names.index("DJANGO_ALLOWED_HOSTS"), name  # defined before use
        hosts = next(e["value"] for e in env if e["name"] == "DJANGO_ALLOWED_HOSTS")
        assert hosts == "$(DJANGO_ALLOWED_HOSTS),$(POD_IP)", name


def test_every_gpu_prod_image_comes_from_the_registry():
    for doc in render("gpu-prod"):
        if doc["kind"] in ("Deployment", "Job"):
            spec = doc["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                assert container["image"].startswith("registry.example.com/"), (doc["metadata"]["name"], container)


def test_the_llm_pool_has_tensor_parallel_gpus_shared_memory_and_registers_like_the_base_pool():
    docs = render("gpu-prod")
    llm, base = _pod(docs, "triton-llm"), _pod(docs, "triton")
    (triton,) = llm["containers"]
    assert triton["image"].endswith("/controlplane-triton-vllm:0.1.0")
    gpus = triton["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpus) >= 2 and triton["resources"]["requests"]["nvidia.com/gpu"] == gpus
    (shm,) = [v for v in llm["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    size = shm["emptyDir"]["sizeLimit"]
    assert size.endswith("Gi") and int(size[:-2]) >= 8 * int(gpus)  # NCCL between the ranks of one instance
    assert {m["mountPath"] for m in triton["volumeMounts"]} == {"/models", "/weights", "/dev/shm"}
    assert "--model-control-mode=explicit" in triton["args"]
    # Registered and drained exactly as the base pool, only the pool name differs.
    (agent,) = [c for c in llm["initContainers"] if c["name"] == "fleet-agent"]
    (base_agent,) = [c for c in base["initContainers"] if c["name"] == "fleet-agent"]
    assert agent["command"] == base_agent["command"] and agent["restartPolicy"] == "Always"
    assert {e["name"]: e.get("value") for e in agent["env"]}["TRITON_POOL"] == "llm"
    assert triton["lifecycle"] == base["containers"][0]["lifecycle"]
    assert llm["nodeSelector"] == base["nodeSelector"] and llm["tolerations"] == base["tolerations"]
    # KEDA follows the llm pool's gauge, within FLEET_POOLS' bounds; the ServiceMonitor reaches its metrics.
    scaled = find(docs, "ScaledObject", "triton-llm")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "triton-llm"
    assert 'pool="llm"' in scaled["spec"]["triggers"][0]["metadata"]["query"]
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("controlplane-config")
    ]
    pools = dict(entry.split("=", 1) for entry in config["data"]["FLEET_POOLS"].split(","))
    assert pools["llm"] == f"{scaled['spec']['minReplicaCount']}:{scaled['spec']['maxReplicaCount']}"
    service = find(docs, "Service", "triton-llm")
    assert service["metadata"]["labels"]["app.kubernetes.io/part-of"] == "batch-controlplane"
    assert "triton-metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert find(docs, "PodDisruptionBudget", "triton-llm")["spec"]["maxUnavailable"] == 1
    claims = {v["persistentVolumeClaim"]["claimName"] for v in llm["volumes"] if "persistentVolumeClaim" in v}
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"} >= claims


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_internal_fleet_endpoints_have_their_own_service_open_only_to_the_fleet(overlay):
    docs = render(overlay)
    web_pod = find(docs, "Deployment", "controlplane-web")["spec"]["template"]
    nginx = next(c for c in web_pod["spec"]["containers"] if c["name"] == "nginx")
    ports = {p["name"]: p["containerPort"] for p in nginx["ports"]}
    assert ports == {"http": 8080, "fleet": 8081}  # nginx.conf's tenant and fleet servers (tests/deploy/test_nginx)
    tenant_facing = find(docs, "Service", "controlplane-web")
    assert [p["targetPort"] for p in tenant_facing["spec"]["ports"]] == ["http"]
    fleet = find(docs, "Service", "controlplane-fleet")
    assert [p["targetPort"] for p in fleet["spec"]["ports"]] == ["fleet"]
    assert fleet["spec"]["selector"].items() <= web_pod["metadata"]["labels"].items()
    # Not scraped as a web target (the ServiceMonitor follows ports named http).
    assert all(p["name"] != "http" for p in fleet["spec"]["ports"])
    # The drain hooks call the fleet Service, whose host Django accepts.
    config = find(docs, "ConfigMap", "controlplane-config")["data"]
    assert config["CONTROLPLANE_INTERNAL_URL"] == f"http://controlplane-fleet:{fleet['spec']['ports'][0]['port']}"
    assert "controlplane-fleet" in config["DJANGO_ALLOWED_HOSTS"].split(",")

    policy = find(docs, "NetworkPolicy", "controlplane-web")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= web_pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    # Each open port and who may reach it; a rule without `from` is open to all.
    opened = {p["port"]: rule.get("from") for rule in rules for p in rule["ports"]}
    assert set(opened) == {"http", "fleet"}  # gunicorn's 8000 is reached over the loopback only
    assert opened["http"] is None
    [fleet_peers] = opened["fleet"]
    selector = fleet_peers["podSelector"]["matchLabels"]
    assert "namespaceSelector" not in fleet_peers and "ipBlock" not in fleet_peers
    # Exactly the pods that call the drain endpoint match it: every Triton pool, and no control-plane pod.
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        containers = doc["spec"]["template"]["spec"]["containers"]
        calls_drain = any("/internal/fleet/" in str(c.get("lifecycle", {})) for c in containers)
        assert (selector.items() <= labels.items()) == calls_drain, doc["metadata"]["name"]


def test_production_hands_downloads_to_s3_and_dev_streams_them():
    """gpu-prod's clients reach AWS S3 and get presigned URLs (files/views.py); dev's MinIO is in-cluster only."""
    prod = find(render("gpu-prod"), "ConfigMap", "controlplane-config")["data"]
    assert prod["STORAGE_BACKEND"] == "s3" and not prod["S3_ENDPOINT_URL"]
    assert 0 < int(prod["FILE_DOWNLOAD_PRESIGNED_SECONDS"]) <= 900
    dev = find(render("dev"), "ConfigMap", "controlplane-config")["data"]
    assert dev["S3_ENDPOINT_URL"] and "FILE_DOWNLOAD_PRESIGNED_SECONDS" not in dev

"""Tracing in the deploy configs (docs/architecture/tracing.md, "Traces"): compose and both Kustomize overlays run an
OpenTelemetry Collector and Jaeger, every control plane process exports to the collector's OTLP/HTTP port with a
sampler the settings accept, every Triton runs in OpenTelemetry trace mode with the local runner's flags
(deploy/local/triton_server.trace_args) aimed at the same collector, and the collector's one configuration
(shared by both) receives on those ports and exports to the trace UI's OTLP port. The objects themselves are
validated against the compose spec and Kubernetes' schemas by test_compose.py and test_k8s.py."""

from __future__ import annotations

import copy
import re
from urllib.parse import urlsplit

import pytest
import yaml

from controlplane.core.observability.tracing import SAMPLERS
from deploy.local.triton_server import trace_args, trace_args_from_env
from tests.deploy.manifests import DEPLOY, OVERLAYS, compose_errors, compose_file, find, render

COLLECTOR_CONFIG = DEPLOY / "k8s" / "base" / "otel-collector.yaml"


def _collector_ports(config: dict) -> dict[str, int]:
    protocols = config["receivers"]["otlp"]["protocols"]
    return {name: int(protocols[name]["endpoint"].rsplit(":", 1)[1]) for name in protocols}


def _trace_flags(args: list[str]) -> list[str]:
    return [arg for arg in args if arg.startswith("--trace-config")]


def _check_collector(config: dict, *, ui_host: str, ui_ports: set[int]) -> None:
    [pipeline] = config["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlp"] and "batch" in pipeline["processors"]
    for name in pipeline["processors"]:
        assert name in config["processors"], name
    [exporter] = pipeline["exporters"]
    host, port = config["exporters"][exporter]["endpoint"].rsplit(":", 1)
    assert host == ui_host and int(port) in ui_ports


def _check_exporting_to(endpoint: str, *, collector_host: str, collector_ports: dict[str, int]) -> None:
    url = urlsplit(endpoint)
    assert (url.scheme, url.hostname, url.port) == ("http", collector_host, collector_ports["http"])


def test_the_collector_configuration_is_one_otlp_pipeline_to_jaeger():
    config = yaml.safe_load(COLLECTOR_CONFIG.read_text())
    assert _collector_ports(config) == {"grpc": 4317, "http": 4318}
    _check_collector(config, ui_host="jaeger", ui_ports={4317})


def test_compose_traces_every_process_and_triton_into_jaeger():
    services = compose_file()["services"]
    assert {"otel-collector", "jaeger"} <= set(services)
    collector = services["otel-collector"]
    [mount] = collector["volumes"]
    assert mount.split(":")[0] == "../k8s/base/otel-collector.yaml"  # the one configuration, shared with k8s
    assert collector["command"] == [f"--config={mount.split(':')[1]}"]
    # The trace viewer has no login and shows every tenant's batches: published on the host's loopback only.
    assert services["jaeger"]["ports"] and all(
        port.startswith("127.0.0.1:") and port.endswith(":16686") for port in services["jaeger"]["ports"]
    )
    ports = _collector_ports(yaml.safe_load(COLLECTOR_CONFIG.read_text()))

    env = services["web"]["environment"]
    endpoint = re.sub(r"\$\{[A-Z_]+-([^}]*)\}", r"\1", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    _check_exporting_to(endpoint, collector_host="otel-collector", collector_ports=ports)
    assert re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", env["OTEL_TRACES_SAMPLER"]) in SAMPLERS
    for name in ("triton", "triton-llm"):
        flags = [re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", arg) for arg in _trace_flags(services[name]["command"])]
        assert flags == trace_args(endpoint, service_name=name), name


def test_compose_without_the_collector_image_fails_validation():
    broken = copy.deepcopy(compose_file())
    broken["services"]["otel-collector"]["volumes"] = "../k8s/base/otel-collector.yaml"  # a list, not a string
    assert compose_errors(broken)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_traces_every_process_and_triton_into_jaeger(overlay):
    docs = render(overlay)
    [collector_config] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("otel-collector")
    ]
    config = yaml.safe_load(collector_config["data"]["otel-collector.yaml"])
    assert config == yaml.safe_load(COLLECTOR_CONFIG.read_text())
    collector = find(docs, "Deployment", "otel-collector")["spec"]["template"]["spec"]
    [volume] = collector["volumes"]
    assert volume["configMap"]["name"] == collector_config["metadata"]["name"]
    service_ports = {p["port"] for p in find(docs, "Service", "otel-collector")["spec"]["ports"]}
    ports = _collector_ports(config)
    assert set(ports.values()) <= service_ports
    jaeger_ports = {p["port"] for p in find(docs, "Service", "jaeger")["spec"]["ports"]}
    assert 16686 in jaeger_ports
    _check_collector(config, ui_host="jaeger", ui_ports=jaeger_ports)

    settings = find(docs, "ConfigMap", "controlplane-config")["data"]
    endpoint = settings["OTEL_EXPORTER_OTLP_ENDPOINT"]
    _check_exporting_to(endpoint, collector_host="otel-collector", collector_ports=ports)
    assert settings["OTEL_TRACES_SAMPLER"] in SAMPLERS and 0 <= float(settings["OTEL_TRACES_SAMPLER_ARG"]) <= 1
    tritons = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("triton")]
    assert tritons
    for triton in tritons:
        name = triton["metadata"]["name"]
        [server] = [c for c in triton["spec"]["template"]["spec"]["containers"] if c["name"] == "triton"]
        assert _trace_flags(server["args"]) == trace_args(endpoint, service_name=name), name


def test_the_local_runner_traces_triton_only_when_asked_and_exporting():
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert trace_args_from_env(endpoint) == []
    assert trace_args_from_env({"LOCAL_TRITON_TRACING": "1"}) == []
    flags = trace_args_from_env({**endpoint, "LOCAL_TRITON_TRACING": "1", "LOCAL_TRITON_TRACE_RATE": "10"})
    assert "--trace-config=mode=opentelemetry" in flags and "--trace-config=rate=10" in flags
    assert "--trace-config=opentelemetry,url=http://127.0.0.1:4318/v1/traces" in flags

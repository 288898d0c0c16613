"""How placements become Triton instance_group overrides (pure parts of the reconciler)."""

from __future__ import annotations

from django.conf import settings

from controlplane.fleet.models import TritonServer
from controlplane.fleet.placement.reconciler import _instance_groups
from controlplane.triton.client import cpu_instances, repository_model_config


def test_declared_gpus_become_cpu_instances_summed():
    server = TritonServer(name="cpu", grpc_url="x", real_gpus=False)
    assert _instance_groups(server, {"0": 2, "1": 1}) == [{"count": 3, "kind": "KIND_CPU"}]


def test_a_cpu_server_runs_the_configs_kind_cpu_count_per_placed_instance():
    server = TritonServer(name="cpu", grpc_url="x", real_gpus=False)
    assert _instance_groups(server, {"0": 2}, cpu_per_instance=2) == [{"count": 4, "kind": "KIND_CPU"}]
    gpu = TritonServer(name="gpu", grpc_url="x", real_gpus=True)
    assert _instance_groups(gpu, {"0": 2}, cpu_per_instance=2) == [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}]


def test_cpu_instances_reads_the_repository_config():
    assert cpu_instances({"instance_group": [{"kind": "KIND_CPU", "count": 2}]}) == 2
    assert cpu_instances({"instance_group": [{"kind": "KIND_GPU", "count": 3}]}) == 1
    assert cpu_instances({}) == 1
    # MiniLM ships as two single-thread instances per placed instance (triton_models/minilm/config.pbtxt).
    minilm = repository_model_config(settings.TRITON_MODEL_REPOSITORY, "minilm")
    assert cpu_instances(minilm) == 2
    assert minilm["parameters"]["INTRA_OP_THREADS"]["string_value"] == "1"
    assert cpu_instances(repository_model_config(settings.TRITON_MODEL_REPOSITORY, "identity")) == 1


def test_real_gpus_get_one_group_per_gpu_and_gangs_are_model_instances():
    server = TritonServer(name="gpu", grpc_url="x", real_gpus=True)
    assert _instance_groups(server, {"1": 2, "0": 1, "2,3": 1}) == [
        {"count": 1, "kind": "KIND_GPU", "gpus": [0]},
        {"count": 2, "kind": "KIND_GPU", "gpus": [1]},
        {"count": 1, "kind": "KIND_MODEL"},
    ]

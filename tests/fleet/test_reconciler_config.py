"""How placements become Triton instance_group overrides (pure parts of the reconciler)."""

from __future__ import annotations

from controlplane.fleet.models import TritonServer
from controlplane.fleet.reconciler import _instance_groups


def test_declared_gpus_become_cpu_instances_summed():
    server = TritonServer(name="cpu", grpc_url="x", real_gpus=False)
    assert _instance_groups(server, {"0": 2, "1": 1}) == [{"count": 3, "kind": "KIND_CPU"}]


def test_real_gpus_get_one_group_per_gpu_and_gangs_are_model_instances():
    server = TritonServer(name="gpu", grpc_url="x", real_gpus=True)
    assert _instance_groups(server, {"1": 2, "0": 1, "2,3": 1}) == [
        {"count": 1, "kind": "KIND_GPU", "gpus": [0]},
        {"count": 2, "kind": "KIND_GPU", "gpus": [1]},
        {"count": 1, "kind": "KIND_MODEL"},
    ]

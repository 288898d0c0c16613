"""Measured memory per instance from Triton's statistics (fleet/placement/memory.py), fed the answers a GPU server
gives: this CPU host reports no GPU memory, so the measured path is exercised here with those answers."""

from __future__ import annotations

import pytest

from controlplane.fleet.placement.memory import (
    measured_bytes_per_gpu,
    measured_bytes_per_instance,
    planned_bytes_per_instance,
)

MIB = 1024**2


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture (pytest-django); nothing here touches storage."""
    return None


def _stats(*usages):
    """The JSON form of ModelStatisticsResponse: int64 fields arrive as strings."""
    return {
        "model_stats": [
            {
                "name": "minilm",
                "version": "1",
                "memory_usage": [{"type": t, "id": str(i), "byte_size": str(b)} for t, i, b in usages],
            }
        ]
    }


def test_gpu_usage_is_summed_per_device_and_cpu_usage_ignored():
    stats = _stats(("GPU", 0, 300 * MIB), ("GPU", 1, 120 * MIB), ("CPU", 0, 999 * MIB), ("GPU", 0, 20 * MIB))
    assert measured_bytes_per_gpu(stats) == {0: 320 * MIB, 1: 120 * MIB}


def test_per_instance_is_the_largest_gpu_share_divided_by_instances():
    stats = _stats(("GPU", 0, 600 * MIB), ("GPU", 1, 602 * MIB))
    assert measured_bytes_per_instance(stats, instances=2, gpus=(0, 1)) == 301 * MIB
    assert measured_bytes_per_instance(stats, instances=2, gpus=(0,)) == 300 * MIB


@pytest.mark.parametrize(
    "stats",
    [{}, {"model_stats": [{"name": "m", "inference_stats": {}}]}, _stats(("CPU", 0, 5)), _stats(("GPU", 3, 5))],
)
def test_nothing_measured_on_the_placement_gpus_gives_none(stats):
    assert measured_bytes_per_instance(stats, instances=1, gpus=(0,)) is None


def test_the_planner_uses_the_largest_measurement_else_the_declared_prior():
    assert planned_bytes_per_instance(512 * MIB, []) == 512 * MIB
    assert planned_bytes_per_instance(512 * MIB, [None, None]) == 512 * MIB
    assert planned_bytes_per_instance(512 * MIB, [700 * MIB, None, 650 * MIB]) == 700 * MIB
    assert planned_bytes_per_instance(512 * MIB, [400 * MIB]) == 400 * MIB  # measured lower: trust the measurement


class _FakeTriton:
    """Answers model_statistics as a GPU server does; only what _record_statistics calls."""

    def __init__(self, stats):
        self.stats = stats

    def model_statistics(self, name):
        return self.stats


@pytest.mark.django_db
@pytest.mark.parametrize("real_gpus", [True, False])
def test_the_reconciler_records_measured_memory_and_the_planner_uses_it(catalogue, real_gpus):
    from controlplane.fleet.membership.inventory import server_register
    from controlplane.fleet.models import CatalogueModel, Placement
    from controlplane.fleet.placement import reconciler

    server = server_register(name="g0", grpc_url="g0:8001", gpu_memory_bytes=[80 * 1024 * MIB], real_gpus=real_gpus)
    model = CatalogueModel.objects.get(triton_name="minilm")
    placement = Placement.objects.create(model=model, server=server, gpus="0", instances=2, status="ready")
    reconciler._record_statistics(_FakeTriton(_stats(("GPU", 0, 1400 * MIB))), placement)
    placement.refresh_from_db()
    _demands, _servers, _gpus, profiles, _current, _params = reconciler.planner_inputs(0.0)
    planned = next(p.memory_per_instance_bytes for p in profiles if p.model == "minilm")
    if real_gpus:
        assert placement.measured_memory_bytes == 700 * MIB and planned == 700 * MIB
    else:  # declared GPUs: a CPU server's statistics say nothing about them
        assert placement.measured_memory_bytes is None and planned == model.memory_per_instance_bytes

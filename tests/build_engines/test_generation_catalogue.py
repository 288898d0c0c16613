"""A generation manifest against the catalogue: the placement profile it maps to, and the refusal that names
the fields CatalogueModel lacks for generation models (kind, context length, endpoints)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from controlplane.fleet.catalogue import GENERATION_FIELDS_MISSING, generation_profile
from tests.build_engines.test_generation_emit import TRT, emit


def test_a_tensor_parallel_manifest_maps_to_a_gang_profile_with_its_kv_budget(tmp_path):
    _, _, manifest = emit(tmp_path, TRT)
    profile = generation_profile(manifest)
    assert profile["gpus_per_instance"] == 2 and profile["pool"] == "llm"
    # Per GPU, KV budget included: weights + 0.5 x (80 GiB - weights), well above the weights alone.
    assert profile["memory_per_instance_bytes"] == manifest["memory_per_gpu_bytes"]
    assert profile["memory_per_instance_bytes"] > 40 * 1024**3 > manifest["estimate"]["weights_bytes_per_gpu"]


def test_registering_a_generation_manifest_names_the_missing_catalogue_fields(db, tmp_path):
    from controlplane.fleet.models import CatalogueModel

    spec, folder, _ = emit(tmp_path)
    with pytest.raises(CommandError) as caught:
        call_command(
            "catalogue_register",
            str(tmp_path / "out" / spec.triton_name / "manifest.json"),
            "--name",
            "lm",
            "--triton-name",
            spec.triton_name,
            "--model-repository",
            str(folder.parent),
        )
    message = str(caught.value)
    assert "describes a generation model (vllm)" in message
    assert all(field in message for field in GENERATION_FIELDS_MISSING)
    assert "gpus_per_instance=2" in message and "memory_per_instance_bytes=" in message
    assert not CatalogueModel.objects.filter(name="lm").exists()

"""The catalogue seed (controlplane/fleet/catalogue/seed.py) against the shipped Triton configs it names: the
scheduler packs calls by the seed's max_batch_size, Triton refuses a call larger than its config's, so the two
must agree (a tuned config.pbtxt, `python -m build_engines tune --write`, changes only the config)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controlplane.fleet.catalogue.seed import SEED

MODELS = Path(__file__).resolve().parents[2] / "triton_models"


def _config_max_batch_size(triton_name: str) -> int:
    text = (MODELS / triton_name / "config.pbtxt").read_text()
    match = re.search(r"^\s*max_batch_size\s*:\s*(\d+)", text, flags=re.M)
    return int(match.group(1)) if match else 0


@pytest.mark.parametrize("entry", SEED, ids=lambda entry: entry["name"])
def test_the_seeds_max_batch_size_is_its_configs(entry):
    configured = _config_max_batch_size(entry["triton_name"])
    if configured == 0:
        # Triton batches nothing (a decoupled generation engine): the control plane sends one line per request.
        assert entry["max_batch_size"] == 1, entry["name"]
    else:
        assert entry["max_batch_size"] == configured, (entry["name"], configured)


@pytest.mark.parametrize("entry", SEED, ids=lambda entry: entry["name"])
def test_every_input_the_seed_declares_is_in_its_config(entry):
    # The kinds send an optional extra (prompt_token_ids, return_num_cached_tokens) to a model that declares it;
    # Triton refuses an input its config does not name.
    text = (MODELS / entry["triton_name"] / "config.pbtxt").read_text()
    configured = set(re.findall(r'name:\s*"([^"]+)"', text))
    assert {spec["name"] for spec in entry["inputs"]} <= configured, entry["name"]


@pytest.mark.django_db
def test_the_migration_declares_prompt_token_ids_on_existing_engine_models_once():
    from importlib import import_module

    from django.apps import apps

    from controlplane.fleet.models import CatalogueModel

    migration = import_module("controlplane.fleet.migrations.0019_engine_prompt_token_ids")
    without = [s for s in CatalogueModel.objects.get(name="tinylm").inputs if s["name"] != "prompt_token_ids"]
    CatalogueModel.objects.filter(name="tinylm").update(inputs=without)
    for _ in range(2):  # idempotent: a second run adds nothing
        migration.declare(apps, None)
        names = [s["name"] for s in CatalogueModel.objects.get(name="tinylm").inputs]
        assert names.count("prompt_token_ids") == 1 and names[:-1] == [s["name"] for s in without]
    migration.undeclare(apps, None)
    assert CatalogueModel.objects.get(name="tinylm").inputs == without

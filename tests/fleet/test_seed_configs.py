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

"""The tinylm engine suite: the model `make install` trains (triton_models/tinylm/1/hf), driven in process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

MODEL_VERSION_DIR = Path(__file__).resolve().parents[2] / "triton_models" / "tinylm" / "1"
HF_DIR = MODEL_VERSION_DIR / "hf"
# The engine's modules sit next to model.py (as Triton's python backend wants them), not in a package.
if str(MODEL_VERSION_DIR) not in sys.path:
    sys.path.insert(0, str(MODEL_VERSION_DIR))


@pytest.fixture(scope="session")
def hf_dir() -> Path:
    if not (HF_DIR / "model.safetensors").exists():
        pytest.fail(f"{HF_DIR} is missing: `make install` trains it (build_engines/sources/tinylm.py)")
    return HF_DIR


@pytest.fixture(scope="session")
def engine(hf_dir: Path):
    from cb_engine import Engine

    return Engine(str(hf_dir), kv_budget_tokens=4096, max_seqs=32, threads=1)


ADAPTERS_DIR = MODEL_VERSION_DIR / "adapters"


@pytest.fixture(scope="session")
def adapters_dir(hf_dir: Path) -> Path:
    if not (ADAPTERS_DIR / ".built").exists():
        pytest.fail(f"{ADAPTERS_DIR} is missing: `make install` trains them (build_engines/sources/tinylm_adapters.py)")
    return ADAPTERS_DIR


@pytest.fixture(scope="session")
def lora_engine(hf_dir: Path, adapters_dir: Path):
    """tinylm with its two adapters loaded at start ("double" and "reverse")."""
    from cb_engine import Engine

    return Engine(
        str(hf_dir), kv_budget_tokens=4096, max_seqs=32, threads=1, adapters_dir=str(adapters_dir), adapters=None
    )

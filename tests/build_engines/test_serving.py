"""The exported MiniLM served for real: export + emit with the shipped spec, tritonserver loading
`minilm_ort` from a copy of triton_models/, parity with torch on the corpus, then `catalogue_register` and
a batch driven through the services against that server.

One export (~15 s) and one server start per session; the repository tree is never written to.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from controlplane.triton.client import TritonClient
from deploy.local.inprocess import InProcessMiniLM
from deploy.local.triton_server import LocalTriton
from tests.build_engines.conftest import CORPUS, REPO_ROOT
from tests.support.triton_fixture import triton_client, triton_server

ONNX_NAME = "all-MiniLM-L6-v2-onnx"
TRITON_NAME = "minilm_ort"
SENTENCES = [line for line in CORPUS.read_text("utf-8").splitlines() if line.strip()]


@dataclass(frozen=True)
class Build:
    """What export + emit leave behind: the manifest beside the artefact, and the Triton repository."""

    manifest: Path
    models: Path

    @property
    def served(self) -> Path:
        return self.models / TRITON_NAME / "1" / "model.onnx"


@pytest.fixture(scope="session")
def served_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """Export the shipped minilm spec and emit it into a copy of triton_models/ (built artefacts left out)."""
    from build_engines.cli import main

    root = tmp_path_factory.mktemp("serving")
    out, models = root / "out", root / "triton_models"
    shutil.copytree(
        REPO_ROOT / "triton_models",
        models,
        ignore=shutil.ignore_patterns("*.onnx", "*.plan", "manifest.json", "__pycache__"),
    )
    with contextlib.redirect_stdout(io.StringIO()):
        for step in ("export", "emit"):
            args = [step, "minilm", "--out", str(out)] + (["--models-dir", str(models)] if step == "emit" else [])
            assert main(args) == 0, step
    return Build(out / "onnx" / "manifest.json", models)


@pytest.fixture(scope="session")
def triton_model_repository(served_build: Build) -> Path:
    """Overrides tests.support.triton_fixture's: the server serves the tmp copy with the freshly emitted model."""
    return served_build.models


@pytest.fixture(scope="session")
def minilm_ort(triton_client: TritonClient) -> TritonClient:
    triton_client.ensure_loaded(TRITON_NAME)
    return triton_client


@pytest.fixture(scope="session")
def torch_corpus() -> tuple[np.ndarray, list[int]]:
    return InProcessMiniLM(threads=2).embed(SENTENCES)


@pytest.fixture
def batch_storage(settings, tmp_path: Path) -> Path:
    """tests/conftest.py's per-test blob storage, which build_engines/conftest.py shadows (no Django there)."""
    location = tmp_path / "storage"
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(location)}},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    return location


def _register(build: Build, manifest: Path | None = None, **options: str) -> str:
    stdout = io.StringIO()
    call_command(
        "catalogue_register",
        str(manifest or build.manifest),
        "--model-repository",
        str(build.models),
        stdout=stdout,
        **options,
    )
    return stdout.getvalue()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_minilm_ort_matches_torch_on_the_corpus(minilm_ort: TritonClient, torch_corpus) -> None:
    texts = np.array([[s.encode("utf-8")] for s in SENTENCES], dtype=np.object_)
    got = minilm_ort.infer(TRITON_NAME, {"TEXT": texts}, ["EMBEDDING", "TOKENS"])
    expected, expected_tokens = torch_corpus
    assert got["EMBEDDING"].shape == (len(SENTENCES), 384)
    cosine = _cosines(got["EMBEDDING"], expected)
    assert cosine.min() >= 0.9999, dict(zip(SENTENCES, cosine.tolist(), strict=True))
    assert got["TOKENS"].ravel().tolist() == expected_tokens


def test_registered_model_runs_a_batch_through_triton(
    minilm_ort: TritonClient,
    triton_server: LocalTriton,
    served_build: Build,
    torch_corpus,
    batch_storage,
    tenant,
    settings,
    monkeypatch,
) -> None:
    # Imported here, not at the top: the rest of the build_engines suite also runs without Django.
    from controlplane.batches import services
    from controlplane.batches.models import Batch, BatchStatus, Shard
    from controlplane.core.messaging import dispatch
    from controlplane.files.models import File
    from controlplane.files.storage import blob_open
    from controlplane.fleet.backend import TritonBackend
    from controlplane.fleet.models import CatalogueModel
    from controlplane.scheduling.runner import shard_run_next
    from tests.support.batches import embedding_line, jsonl, upload

    output = _register(served_build, name=ONNX_NAME, triton_name=TRITON_NAME)
    assert f"'{ONNX_NAME}' -> Triton model '{TRITON_NAME}'" in output
    model = CatalogueModel.objects.get(name=ONNX_NAME)
    assert (model.triton_name, model.kind, model.max_batch_size, model.embedding_dimensions) == (
        TRITON_NAME,
        "embeddings",
        64,
        384,
    )
    assert model.inputs == [{"name": "TEXT", "datatype": "BYTES", "dims": [1]}]
    assert model.outputs == [
        {"name": "EMBEDDING", "datatype": "FP32", "dims": [384]},
        {"name": "TOKENS", "datatype": "INT32", "dims": [1]},
    ]

    # The services run the batch in-process; nothing is enqueued.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 10  # 24 lines: three shards, the last one short
    file = upload(tenant, jsonl([embedding_line(f"s{i}", s, model=ONNX_NAME) for i, s in enumerate(SENTENCES)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    backend = TritonBackend(minilm_ort, triton_server.grpc_url)  # what backend_for_shard builds per server
    asked_for: list[str] = []

    def backend_for(triton_model: str) -> TritonBackend:
        asked_for.append(triton_model)
        return backend

    # Three slot cycles, as a worker runs them: each routes the model by its Triton name, then claims.
    for shard in Shard.objects.filter(batch=batch).order_by("index"):
        cycle = shard_run_next(model=model, owner="test", backend_factory=backend_for)
        assert cycle is not None and (cycle.shard_id, cycle.outcome) == (shard.id, "succeeded")
    assert asked_for == [TRITON_NAME] * 3

    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED, batch.errors
    assert (batch.completed_lines, batch.failed_lines) == (len(SENTENCES), 0)
    with blob_open(File.objects.get(id=batch.output_file_id).storage_name) as fh:
        records = [json.loads(line) for line in fh]
    assert [r["custom_id"] for r in records] == [f"s{i}" for i in range(len(SENTENCES))]
    bodies = [r["response"]["body"] for r in records]
    assert all(len(body["data"]) == 1 and body["model"] == ONNX_NAME for body in bodies)
    embeddings = np.array([body["data"][0]["embedding"] for body in bodies], dtype=np.float32)
    expected, expected_tokens = torch_corpus
    assert _cosines(embeddings, expected).min() >= 0.9999
    assert [body["usage"]["prompt_tokens"] for body in bodies] == expected_tokens


# --- catalogue_register's refusals: no export, no server, a stand-in artefact ---------------------------


@pytest.fixture
def fake_build(tmp_path: Path) -> Build:
    """A manifest, its artefact and the emitted copy, as export + emit leave them (the 'model' is 5 bytes)."""
    import hashlib

    artefact = tmp_path / "out" / "onnx" / "model.onnx"
    artefact.parent.mkdir(parents=True)
    artefact.write_bytes(b"model")
    manifest = artefact.with_name("manifest.json")
    manifest.write_text(
        json.dumps(
            {"artefact": "model.onnx", "model": "minilm", "bytes": 5, "sha256": hashlib.sha256(b"model").hexdigest()}
        )
    )
    models = tmp_path / "triton_models"
    (models / TRITON_NAME / "1").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "triton_models" / TRITON_NAME / "config.pbtxt", models / TRITON_NAME)
    shutil.copy2(artefact, models / TRITON_NAME / "1" / "model.onnx")
    return Build(manifest, models)


def test_register_creates_then_updates_keeping_the_measured_profile(db, fake_build: Build) -> None:
    from controlplane.fleet.models import CatalogueModel

    _register(fake_build)
    model = CatalogueModel.objects.get(name=ONNX_NAME)
    assert model.memory_per_instance_bytes > 320 * 1024**2 and model.load_seconds > 0
    CatalogueModel.objects.filter(id=model.id).update(load_seconds=3.5, max_batch_size=1)
    _register(fake_build)
    model.refresh_from_db()
    assert (model.load_seconds, model.max_batch_size) == (3.5, 64)


def test_register_refuses_a_missing_manifest(db, fake_build: Build) -> None:
    with pytest.raises(CommandError, match=r"No manifest at .*python -m build_engines all minilm"):
        _register(fake_build, manifest=fake_build.manifest.with_name("nope.json"))


@pytest.mark.parametrize("where", ["artefact", "served"])
def test_register_refuses_a_changed_or_missing_artefact(db, fake_build: Build, where: str) -> None:
    from controlplane.fleet.models import CatalogueModel

    path = fake_build.manifest.with_name("model.onnx") if where == "artefact" else fake_build.served
    path.write_bytes(b"other")
    with pytest.raises(CommandError, match=r"sha256 .* the manifest says .*python -m build_engines all minilm"):
        _register(fake_build)
    path.unlink()
    with pytest.raises(CommandError, match=r"model\.onnx is missing: run `python -m build_engines all minilm`"):
        _register(fake_build)
    assert not CatalogueModel.objects.filter(name=ONNX_NAME).exists()


def test_register_refuses_a_model_without_the_embeddings_interface(db, fake_build: Build) -> None:
    identity = fake_build.models / "identity"
    shutil.copytree(REPO_ROOT / "triton_models" / "identity", identity, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(fake_build.served, identity / "1" / "model.onnx")
    with pytest.raises(CommandError, match=r"lacks the embeddings interface \(input TEXT BYTES"):
        _register(fake_build, triton_name="identity")


def test_register_refuses_a_triton_model_registered_under_another_name(db, fake_build: Build) -> None:
    _register(fake_build)
    with pytest.raises(CommandError, match=f"already in the catalogue as '{ONNX_NAME}'"):
        _register(fake_build, name="another-name")

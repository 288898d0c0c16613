"""Catalogue entries for models built by `python -m build_engines`: embeddings models (here) and generation
models (the fields: generation.py).

The manifest that `export` writes beside every artefact is the contract: this module reads it as plain
JSON, checks that the file Triton will serve is the one the manifest describes, and takes the interface
from the emitted config.pbtxt, so a registered entry cannot disagree with what Triton loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from controlplane.core.http.errors import ValidationFailed
from controlplane.fleet.catalogue.generation import generation_interface, generation_profile, interface_gaps
from controlplane.fleet.models import CatalogueAdapter, CatalogueModel, ModelKind
from controlplane.triton.client import repository_model_config

# The tensors the batch runner sends and reads for an embeddings model (kinds/embeddings.py).
EMBEDDINGS_INTERFACE = {"inputs": {"TEXT": "BYTES"}, "outputs": {"EMBEDDING": "FP32", "TOKENS": "INT32"}}
TRITON_VERSION = "1"  # the version folder `build_engines emit` writes

# Declared placement profile until the planner measures one. minilm_ort's python-backend stub measured
# 414 MiB RSS on CPU with 86 MiB of weights loaded (onnxruntime, transformers and the tokenizer are the
# rest): weights x2 (room for ORT's prepacked copies) + 320 MiB gives ~490 MiB for it and grows with the
# model. Loading it took 7 s on a 2-core CPU at load average 2.8 and 16 s at 5.5; 15 s matches the seed's
# torch minilm, which loads the same libraries.
RUNTIME_OVERHEAD_BYTES = 320 * 1024**2
DEFAULT_LOAD_SECONDS = 15.0


def catalogue_register_from_manifest(
    *,
    manifest_path: Path,
    name: str,
    triton_name: str,
    model_repository: Path | None = None,
    tokenizer_dir: Path | None = None,
) -> CatalogueModel:
    """Create or update the catalogue entry `name` served by Triton model `triton_name`.

    Invariants: what Triton will serve is what the manifest describes (an embeddings model: the artefact beside
    the manifest and the copy in `model_repository/<triton_name>/1/` hash to its sha256; a generation model:
    its config.pbtxt and model.json hash to the manifest's served_files), else ValidationFailed and nothing
    written; the emitted config declares the interface its kind sends. Updating an entry refreshes its
    interface but keeps its placement profile, which the planner may have measured since, and its is_enabled,
    which an operator may have set.
    """
    repository = Path(model_repository or settings.TRITON_MODEL_REPOSITORY)
    manifest = _read_manifest(manifest_path, triton_name)
    if manifest.get("kind") == "generation":
        return _register_generation(manifest, manifest_path, name, triton_name, repository, tokenizer_dir)
    rebuild = f"run `python -m build_engines all {manifest['model']}`"
    artefact = str(manifest["artefact"])
    served = repository / triton_name / TRITON_VERSION / artefact
    for path in dict.fromkeys([manifest_path.parent.resolve() / artefact, served.resolve()]):
        _check_sha256(path, str(manifest["sha256"]), rebuild)

    config = _emitted_config(repository, triton_name, rebuild)
    inputs, outputs = _tensors(config.get("input", [])), _tensors(config.get("output", []))
    _check_embeddings_interface(triton_name, inputs, outputs)
    interface = {
        "triton_name": triton_name,
        "kind": ModelKind.EMBEDDINGS,
        # Protobuf JSON omits zero values; a model without batching gets one row per call.
        "max_batch_size": max(1, int(config.get("max_batch_size", 0))),
        "inputs": inputs,
        "outputs": outputs,
        "embedding_dimensions": next(t["dims"][-1] for t in outputs if t["name"] == "EMBEDDING"),
    }
    profile = {
        "memory_per_instance_bytes": 2 * int(manifest.get("bytes") or served.stat().st_size) + RUNTIME_OVERHEAD_BYTES,
        "load_seconds": DEFAULT_LOAD_SECONDS,
    }
    return _save(name, triton_name, interface, profile)


def _register_generation(
    manifest: dict[str, Any],
    manifest_path: Path,
    name: str,
    triton_name: str,
    repository: Path,
    tokenizer_dir: Path | None,
) -> CatalogueModel:
    rebuild = f"run `python -m build_engines emit {manifest.get('spec', {}).get('path', 'SPEC')}`"
    if manifest.get("triton_name") != triton_name:
        raise ValidationFailed(
            f"{manifest_path} describes Triton model {manifest.get('triton_name')!r}, not {triton_name!r}; pass "
            f"--triton-name {manifest.get('triton_name')}.",
            param="triton_name",
        )
    served_files = manifest.get("served_files") or {}
    if "config.pbtxt" not in served_files:
        raise ValidationFailed(f"{manifest_path} lists no served config.pbtxt; {rebuild} to write it again.")
    for relative, sha256 in served_files.items():
        _check_sha256(repository / triton_name / relative, str(sha256), rebuild)
    config = _emitted_config(repository, triton_name, rebuild)
    inputs, outputs = _tensors(config.get("input", [])), _tensors(config.get("output", []))
    interface = generation_interface(
        manifest,
        triton_name=triton_name,
        inputs=inputs,
        outputs=outputs,
        repository=repository,
        tokenizer_dir=tokenizer_dir,
    )
    model = _save(name, triton_name, interface, generation_profile(manifest))
    _save_adapters(model, manifest.get("adapters") or [])
    return model


def _save_adapters(model: CatalogueModel, adapters: list[dict[str, Any]]) -> None:
    """The manifest's LoRA adapters (vLLM's multi_lora.json) as the model's CatalogueAdapter rows, `<model>:<name>`;
    rows the manifest no longer lists are disabled (their lines become 400s), never deleted (the ledger names them)."""
    names = []
    for adapter in adapters:
        name, path = str(adapter["name"]), str(adapter["path"])
        CatalogueAdapter.objects.update_or_create(base=model, name=name, defaults={"path": path, "is_enabled": True})
        names.append(name)
    CatalogueAdapter.objects.filter(base=model).exclude(name__in=names).update(is_enabled=False)


def _save(name: str, triton_name: str, interface: dict[str, Any], profile: dict[str, Any]) -> CatalogueModel:
    with transaction.atomic():
        taken = CatalogueModel.objects.filter(triton_name=triton_name).exclude(name=name).first()
        if taken is not None:
            raise ValidationFailed(
                f"Triton model {triton_name!r} is already in the catalogue as {taken.name!r}; "
                f"register under that name or pass another --triton-name.",
                param="triton_name",
            )
        model, _ = CatalogueModel.objects.update_or_create(
            name=name, defaults=interface, create_defaults={**interface, **profile}
        )
    return model


def _read_manifest(path: Path, triton_name: str) -> dict[str, Any]:
    # Before the manifest is read, the triton name is the best guess at the spec (`minilm_ort` -> minilm).
    rebuild = f"run `python -m build_engines all {triton_name.rsplit('_', 1)[0]}`"
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ValidationFailed(f"No manifest at {path}: {rebuild} to export and emit the model.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationFailed(f"Cannot read the manifest {path}: {exc}; {rebuild} to write it again.") from exc
    if isinstance(manifest, dict) and manifest.get("kind") == "generation":
        return manifest
    missing = [key for key in ("artefact", "sha256", "model") if not isinstance(manifest, dict) or key not in manifest]
    if missing:
        raise ValidationFailed(f"{path} is not a build_engines manifest (no {', '.join(missing)}); {rebuild}.")
    return manifest


def _check_sha256(path: Path, expected: str, rebuild: str) -> None:
    if not path.is_file():
        raise ValidationFailed(f"{path} is missing: {rebuild} to export it and copy it into the Triton repository.")
    # build_engines hashes with this when it writes the manifest; its manifest module imports no torch.
    from build_engines.manifest import sha256_file

    actual = sha256_file(path)
    if actual != expected:
        raise ValidationFailed(
            f"{path} has sha256 {actual[:12]}…, the manifest says {expected[:12]}…: the file changed after it "
            f"was built; {rebuild} to rebuild and re-emit it."
        )


def _emitted_config(repository: Path, triton_name: str, rebuild: str) -> dict[str, Any]:
    if not (repository / triton_name / "config.pbtxt").is_file():
        raise ValidationFailed(f"No {repository / triton_name / 'config.pbtxt'}: {rebuild} to emit it.")
    return repository_model_config(repository, triton_name)


def _tensors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The catalogue's shape for tensors: KServe datatype names, dims without the batch axis.
    return [
        {
            "name": entry["name"],
            "datatype": "BYTES" if entry["data_type"] == "TYPE_STRING" else entry["data_type"].removeprefix("TYPE_"),
            "dims": [int(d) for d in entry.get("dims", [])],
        }
        for entry in entries
    ]


def _check_embeddings_interface(triton_name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
    wrong = interface_gaps(EMBEDDINGS_INTERFACE, inputs, outputs)
    if wrong:
        raise ValidationFailed(
            f"Triton model {triton_name!r} lacks the embeddings interface ({', '.join(wrong)}); register the "
            f"text model `build_engines emit` writes as <name>_ort.",
            param="triton_name",
        )

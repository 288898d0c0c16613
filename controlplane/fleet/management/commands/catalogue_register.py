from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.http.errors import DomainError
from controlplane.fleet.catalogue.manifests import catalogue_register_from_manifest
from controlplane.fleet.models import ModelKind


class Command(BaseCommand):
    help = (
        "Add (or update) a catalogue entry for a model built by `python -m build_engines`, after checking "
        "that what the manifest describes is what the Triton model repository serves (an embeddings model's "
        "artefact; a generation model's config.pbtxt and model.json, and its tokenizer readable here)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("manifest", type=Path, help="e.g. build_engines/out/minilm/onnx/manifest.json")
        parser.add_argument("--name", default="all-MiniLM-L6-v2-onnx", help="the model name tenants use")
        parser.add_argument("--triton-name", default="minilm_ort", help="the emitted Triton model folder")
        parser.add_argument("--model-repository", type=Path, help="default: settings.TRITON_MODEL_REPOSITORY")
        parser.add_argument(
            "--tokenizer-dir",
            type=Path,
            help="a generation model's Hugging Face directory as this machine sees it (its tokenizer and chat "
            "template); default: the manifest's hf_model in the model repository",
        )

    def handle(self, *args: Any, manifest: Path, name: str, triton_name: str, **options: Any) -> None:
        try:
            model = catalogue_register_from_manifest(
                manifest_path=manifest,
                name=name,
                triton_name=triton_name,
                model_repository=options.get("model_repository"),
                tokenizer_dir=options.get("tokenizer_dir"),
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        if model.kind == ModelKind.GENERATION:
            shape = (
                f"generation, {model.context_length}-token context, {model.gpus_per_instance} GPU(s) per instance "
                f"in pool {model.pool!r}, tokenizer {model.tokenizer_dir}"
            )
        else:
            shape = f"{model.embedding_dimensions} dimensions, up to {model.max_batch_size} rows per call"
        self.stdout.write(f"Registered {model.name!r} -> Triton model {model.triton_name!r} ({shape}).")

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.errors import DomainError
from controlplane.fleet.catalogue import catalogue_register_from_manifest


class Command(BaseCommand):
    help = (
        "Add (or update) a catalogue entry for a model built by `python -m build_engines`, after checking "
        "that the artefact the manifest describes is the one in the Triton model repository."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("manifest", type=Path, help="e.g. build_engines/out/minilm/onnx/manifest.json")
        parser.add_argument("--name", default="all-MiniLM-L6-v2-onnx", help="the model name tenants use")
        parser.add_argument("--triton-name", default="minilm_ort", help="the emitted Triton model folder")
        parser.add_argument("--model-repository", type=Path, help="default: settings.TRITON_MODEL_REPOSITORY")

    def handle(self, *args: Any, manifest: Path, name: str, triton_name: str, **options: Any) -> None:
        try:
            model = catalogue_register_from_manifest(
                manifest_path=manifest,
                name=name,
                triton_name=triton_name,
                model_repository=options.get("model_repository"),
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            f"Registered {model.name!r} -> Triton model {model.triton_name!r} "
            f"({model.embedding_dimensions} dimensions, up to {model.max_batch_size} rows per call)."
        )

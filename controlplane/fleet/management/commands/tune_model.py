from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from build_engines.errors import BuildEnginesError
from build_engines.tune import TuneOptions, TuneOutcome, resolve_target, tune, tune_line
from build_engines.tune_measure import Load
from controlplane.core.http.errors import DomainError
from controlplane.fleet.catalogue.tuning import TunedProfile, catalogue_record_tuning
from controlplane.fleet.models import CatalogueModel, ModelKind


class Command(BaseCommand):
    help = (
        "Search a catalogue model's served shape on this host (python -m build_engines tune, at this deployment's "
        "calls in flight) and store what was measured for the served config in the catalogue: max_batch_size, "
        "load_seconds, memory per instance (hosts without an NVIDIA GPU) and, for tensor models, seconds per row. "
        "A generation model's MAX_NUM_SEQS and KV budget are searched instead (2x MAX_NUM_SEQS requests in "
        "flight, completion tokens/s), and max_num_seqs and load_seconds stored. "
        "Without --write the figures are stored only when the current config stays the choice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="catalogue name, e.g. all-MiniLM-L6-v2")
        parser.add_argument("--model-repository", type=Path, help="default: settings.TRITON_MODEL_REPOSITORY")
        parser.add_argument("--budget-s", type=float, default=120.0, help="stop trying candidates after this")
        parser.add_argument(
            "--max-p95-ms", type=float, help="latency bound on a call's p95 (default 2x the baseline's)"
        )
        parser.add_argument("--warmup-s", type=float, default=1.0)
        parser.add_argument("--measure-s", type=float, default=3.0)
        parser.add_argument("--out", type=Path, help="where tune.json goes (default build_engines/out/<model>/)")
        parser.add_argument("--write", action="store_true", help="rewrite the model's config.pbtxt with the choice")
        parser.add_argument("--actor", default="manage.py tune_model", help="recorded in the placement event")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        model = CatalogueModel.objects.filter(name=name).first()
        if model is None:
            raise CommandError(f"no catalogue model named {name!r}")
        repository = options["model_repository"] or Path(settings.TRITON_MODEL_REPOSITORY)
        # One placed instance's share of the scheduler's cap: the calls a shard's slots keep in flight.
        concurrency = min(settings.SCHEDULER_CALLS_PER_INSTANCE, model.max_inflight_calls or 10**6)
        tune_options = TuneOptions(
            load=Load(concurrency, None, options["warmup_s"], options["measure_s"]),
            budget_s=options["budget_s"],
            max_p95_ms=options["max_p95_ms"],
            write=options["write"],
            out_dir=options["out"],
            command=f"manage.py tune_model {name}",
            sequences_in_flight=None,  # generation: 2 x the candidate's MAX_NUM_SEQS, as a shard keeps in flight
        )
        try:
            target = resolve_target(model.triton_name, repository)
            if target.model_dir.parent != repository.resolve():
                raise CommandError(f"{model.triton_name!r} is not a model folder of {repository}")
            outcome = tune(target, tune_options, echo=self.stdout.write)
        except BuildEnginesError as exc:
            raise CommandError(str(exc)) from exc
        result = outcome.result
        if not outcome.written and result.chosen.shape != result.baseline.shape:
            self.stdout.write("Catalogue unchanged: the served config is not the one chosen (run with --write).")
            return
        if model.kind == ModelKind.GENERATION:
            self._store_generation(name, outcome, options["actor"])
            return
        from deploy.local.triton_server import has_nvidia_gpu

        slots = max(1, concurrency // settings.DISPATCH_INFLIGHT_CALLS)
        rows_per_s = result.chosen.measurement.rows_per_s
        profile = TunedProfile(
            max_batch_size=result.chosen.shape.max_batch_size,
            call_rows=max(result.chosen.shape.preferred, default=None),
            load_seconds=round(outcome.load_seconds, 3),
            # On a GPU host the planner needs GPU memory, which the reconciler measures per placement.
            memory_per_instance_bytes=None if has_nvidia_gpu() else outcome.memory["config_bytes"] or None,
            model_seconds_per_work_unit=slots / rows_per_s if model.kind == ModelKind.TENSOR and rows_per_s else None,
            summary=tune_line(outcome.name, result),
        )
        try:
            stored = catalogue_record_tuning(name=name, profile=profile, actor=options["actor"])
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            f"Stored on {stored.name!r}: max_batch_size={stored.max_batch_size}, call_rows={stored.call_rows}, "
            f"load_seconds={stored.load_seconds}, "
            f"memory_per_instance_bytes={stored.memory_per_instance_bytes}, "
            f"model_seconds_per_work_unit={stored.model_seconds_per_work_unit:.6g}."
        )

    def _store_generation(self, name: str, outcome: TuneOutcome, actor: str) -> None:
        profile = TunedProfile(
            max_batch_size=None,
            call_rows=None,
            load_seconds=round(outcome.load_seconds, 3),
            memory_per_instance_bytes=None,
            model_seconds_per_work_unit=None,
            summary=tune_line(outcome.name, outcome.result, "tokens"),
            max_num_seqs=outcome.result.chosen.shape.max_num_seqs,
        )
        try:
            stored = catalogue_record_tuning(name=name, profile=profile, actor=actor)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            f"Stored on {stored.name!r}: max_num_seqs={stored.max_num_seqs}, load_seconds={stored.load_seconds}."
        )

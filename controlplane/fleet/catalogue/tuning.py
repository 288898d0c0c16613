"""What `manage.py tune_model` measured, stored on the catalogue entry (build_engines/tune.py measures it)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from controlplane.core.http.errors import NotFound
from controlplane.fleet.models import CatalogueModel, PlacementEvent


@dataclass(frozen=True)
class TunedProfile:
    """The served config's measured figures; None where this host cannot measure one (GPU memory on a CPU)."""

    max_batch_size: int | None  # the served config's, so the catalogue packs the calls Triton takes; None: generation
    call_rows: int | None  # the config's largest preferred batch size: the calls its shape was measured with
    load_seconds: float  # the config's load from cold
    memory_per_instance_bytes: int | None  # one placed instance: the config's whole instance group (CPU hosts)
    model_seconds_per_work_unit: float | None  # tensor models only: a row is their work unit
    summary: str  # the tuner's TUNE line
    # A generation engine's MAX_NUM_SEQS: what it was tuned for in place of max_batch_size and call_rows.
    max_num_seqs: int | None = None


@transaction.atomic
def catalogue_record_tuning(*, name: str, profile: TunedProfile, actor: str) -> CatalogueModel:
    """Store a tuned config's figures on the catalogue entry named ``name``, with a PlacementEvent saying so.

    The speed figure is a first estimate: shards commit their own measurements and smooth it from there."""
    model = CatalogueModel.objects.select_for_update().filter(name=name).first()
    if model is None:
        raise NotFound(f"no catalogue model named {name!r}", param="name")
    fields: dict[str, object] = {"load_seconds": profile.load_seconds}
    if profile.max_num_seqs is not None:
        fields["max_num_seqs"] = profile.max_num_seqs
    else:
        fields |= {"max_batch_size": profile.max_batch_size, "call_rows": profile.call_rows}
    if profile.memory_per_instance_bytes:
        fields["memory_per_instance_bytes"] = profile.memory_per_instance_bytes
    if profile.model_seconds_per_work_unit:
        fields["model_seconds_per_work_unit"] = profile.model_seconds_per_work_unit
    CatalogueModel.objects.filter(id=model.id).update(**fields)
    PlacementEvent.objects.create(
        model=model,
        action="tuned",
        actor=actor[:100],
        reason=profile.summary + "; stored " + ", ".join(f"{key}={value}" for key, value in fields.items()),
    )
    model.refresh_from_db()
    return model

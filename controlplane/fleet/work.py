"""What fleet needs to know about the work that runs on it, as plain values.

Shards belong to the batch pipeline, a layer above fleet (the import-linter contract in pyproject.toml). Fleet
never reads the Shard table: the pipeline registers a ``WorkSource`` when Django starts (batches/apps.py), and
the planner, the fleet-size loop and the drain read these values through it — as usage receives a
``ShardUsage`` instead of a shard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Demand:
    """A model's live work: lines waiting or running in shards of running batches, the work units they hold
    (tokens or rows: the unit the model's speed is measured in), and shards in flight."""

    pending_lines: int
    in_flight_shards: int
    pending_work_units: float = 0.0


@dataclass(frozen=True)
class BatchBacklog:
    """One running batch's live work. ``work_units`` is None for rows written before work units were counted
    (they count lines); ``schedulable`` leaves out pending work of a paused tenant, which cannot run."""

    model: str
    expires_at: datetime
    work_units: float | None
    lines: int
    running_shards: int
    running_work_units: float


class WorkSource(Protocol):
    def demand_by_model(self) -> dict[str, Demand]: ...

    def demand_by_adapter(self) -> dict[str, int]:
        """LoRA adapter (``tinylm:double``) → its lines waiting or running in shards of live batches: the part
        of its base's ``Demand`` that names it."""
        ...

    def schedulable_backlog(self) -> list[BatchBacklog]: ...

    def shards_routed_to(self, server_name: str) -> int:
        """Shards whose calls may still go to this server (running, live lease, routed there)."""
        ...


_source: WorkSource | None = None


def work_source_register(source: WorkSource) -> None:
    global _source
    _source = source


def work_source() -> WorkSource:
    if _source is None:
        raise ImproperlyConfigured(
            "No WorkSource registered: controlplane.batches must be in INSTALLED_APPS (its AppConfig registers one)."
        )
    return _source

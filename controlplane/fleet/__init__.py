"""The fleet: Triton servers and their GPUs, the model catalogue, which models are placed where, and how many
servers each pool should have.

Subsystems (each a subpackage, private to this app):
- ``catalogue/``: the models a tenant may name, registered from build manifests or seeded (seed.py is plain
  data, imported by the data migrations).
- ``membership/``: servers joining, heartbeating and leaving; their GPUs from Triton's /metrics.
- ``placement/``: the placement loop: the pure planner, consolidation and the payback rule, and the reconciler
  that applies a plan through Triton's repository API; routing reads the ready placements.
- ``sizing/``: the fleet-size loop: the pure planner of servers and workers per pool, and its database side.

Other apps use the app root only: ``models``, ``services`` (writes), ``selectors`` (reads), ``backend`` (the
Backend the scheduler's slots run shards through), ``work`` (the port the batch pipeline registers its work
facts with), ``views`` and ``internal_views`` (through urls.py). The import-linter contract "Fleet's public
surface" in pyproject.toml enforces it."""

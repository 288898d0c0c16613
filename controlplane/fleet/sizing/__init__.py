"""How many Triton servers each pool should have, and how many shard workers: ``planner`` is a pure function of
plain values (``types``, no Django), ``plans`` reads its inputs from the database and stores one plan per pool.
Used by the fleet app (its beat task) and by controlplane.settings, which parses the pools' limits with
``types`` (settings load before any app, so they cannot go through the app's services)."""

"""The second stage: a claimed shard run to its commit. ``execution`` runs the shard's lines through its endpoint
kind and writes its part (``parts``, ``records``), its lease renewed in the background (batches/leases.py) and
every status change made through the shard state machine (batches/shards.py); ``work_facts`` answers fleet's
questions about the work waiting and running. Used by the batches app only (the scheduler runs shards through
batches.services.shard_run); the results stage may read it."""

"""The second stage: a shard from its claim to its commit. ``shards`` is the shard state machine's one writer
(claims, leases, commits, releases, rescues); ``execution`` runs a claimed shard's lines through its endpoint
kind and writes its part (``parts``, ``records``), renewing its lease in the background (``leases``);
``work_facts`` answers fleet's questions about the work waiting and running. Used by the batches app only (the
scheduler runs shards through batches.services); the results stage may read it."""

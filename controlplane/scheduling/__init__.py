"""The scheduler: which shard runs next and where. Slots (``slots``) are permissions to run one model's shards,
capped by its instances; a slot's runner (``runner``) claims the next shard by policy (``claims``, with the
pure fair-share and deadline rules of ``policy``), has the batch pipeline run it (batches.services.shard_run)
and charges it to the tenant's share, timed by ``call_clock``. ``queue_overview`` is the admin's queue page.

Other apps use ``models``, ``selectors`` (what is runnable, the queue's ranking and caps) and ``tasks`` (by
their names, through core.messaging.dispatch); the rest is this app's own (contract "Scheduling's public surface")."""

"""The batch pipeline: a batch's lifecycle from its create to its output file, in three stages a batch passes
in order: ``intake/`` (validation, admission, shard plans), ``run/`` (running a claimed shard, part files) and
``results/`` (finalization, live results, reruns, the data lifecycle sweeps). A stage reads the ones before
it, never the ones after (contract "Batch pipeline stages" in pyproject.toml).

The app root is what other apps and the stages share: ``models``, ``services`` (writes: create, validate,
cancel, expire, and running a shard for the scheduler), ``selectors`` (reads), ``transitions`` and ``shards``
(the batch and the shard state machines' one writers; the scheduler claims through shards), ``leases`` (the
keeper that renews a shard's or a slot's lease), ``pinning`` (the catalogue entry a batch runs against),
``usage_rows`` (a committed shard's ledger entry, written by both state machines), ``priority`` (an
operator's priority change, from the admin and the scheduler's queue page), ``queue_info`` (the port the
scheduler registers its queue ranking with), the API (``views``, ``schema``, ``render``), ``tasks`` and
``admin``. Other apps import the root only; the stages are this app's own (contract "Batches' public
surface")."""

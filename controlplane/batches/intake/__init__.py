"""The first stage: a batch's input read once and judged. Parsing and checking lines (``lines``, ``requests``,
``custom_ids``, ``quickcheck``, ``validation``), the shard plans and shards dispatched while the file is still
read (``early_dispatch``), admission against the tenant's limits, the validation deadline and its rescuer, and
the verdict that fails a batch. Used by the batches app only; the run and results stages may read it."""

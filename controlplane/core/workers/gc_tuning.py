"""The cyclic garbage collector, tuned for worker processes.

A worker holds a large, long-lived heap (Django, Celery, numpy, gRPC: a few hundred thousand objects) and
allocates a shard's lines in bursts. With CPython's default thresholds (700, 10, 10) the collector runs
every 700 container allocations and keeps walking that startup heap: on identity lines it was ~70 % of a
shard's CPU time (docs/performance.md, "Identity hot path"). Two standard remedies, both reversible and bounded:
- ``gc.freeze()`` once start-up is done moves every object alive then into the permanent generation, which
  collections skip (prefork children inherit it, and copy-on-write pages stay shared);
- a higher first threshold (10,000 allocations) collects young objects ~14x less often; cycles are still
  collected, a few MB later at most.
"""

from __future__ import annotations

import gc
from typing import Any

# Allocations between young-generation collections; the older generations keep CPython's ratios.
GEN0_THRESHOLD = 10_000


def gc_tune_for_throughput(**_: Any) -> None:
    """Celery signal handler (worker_init in the parent, worker_process_init in each prefork child)."""
    gc.collect()  # what start-up left as garbage goes now rather than being frozen for the process's life
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)

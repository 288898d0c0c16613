"""The servers in the fleet: registering and heartbeating them (``inventory``), servers joining and draining by
themselves for orchestrators (``join_leave``), and the per-GPU figures read from Triton's /metrics
(``gpu_metrics``, standard library only: scripts/gpu_check.py loads it by path). Used by the fleet app only:
its tasks, admin, internal views, commands and backend."""

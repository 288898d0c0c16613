"""A worker process's plumbing: database.py (connections tidied around each task as Django tidies them around
each request, and a unit of work run again until a restarting Postgres answers) and gc_tuning.py (the cyclic
garbage collector frozen after start-up and tuned for a worker's large, long-lived heap).

Who may use it: controlplane/celery.py (its signal handlers) and the loops that run outside a request and must
ride out a database restart (the scheduler's slot runner, the fleet reconciler, a shard's execution)."""

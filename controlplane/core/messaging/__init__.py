"""Messages on the broker (Celery). Postgres holds the work; the broker carries only "look at this" messages.

- dispatch.py: the one place that sends. A service names a task there and the message goes after its
  transaction commits; the durable kinds go through an outbox row (models.OutboxMessage), which beat relays
  when the broker was down.
- queues.py: which queue carries which task, read by dispatch.py and by settings' CELERY_TASK_ROUTES.
- beat.py: a beat message that a later run of its job has superseded is skipped (models.BeatRun).
- fs_broker.py: the embedded defaults' broker, kombu's filesystem transport with message files never read torn.

Who may use it: the services and admin actions of every app enqueue through dispatch.py (they never import a
task module); settings and controlplane/celery.py wire queues.py, beat.py and fs_broker.py."""

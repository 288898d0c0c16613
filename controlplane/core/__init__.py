"""The bottom floor: what every app of the control plane shares, importing none of them (pyproject.toml,
contract "Apps are layered"). A Django app (label ``core``) for the shared tables (idempotency records, the
outbox, the admin's audit log, beat runs: models.py, admin.py, tasks.py, migrations/) and four subpackages, one
concern each:

- http/: the tenant API's edge: domain errors and their HTTP answers, request parsing and validation,
  pagination, content negotiation, ``Idempotency-Key``, the OpenAPI pieces every app's schema shares, the
  middleware and the per-request log line.
- messaging/: the broker: the one module that sends (dispatch.py, through the outbox), the queue routing table,
  beat's superseded-message rule, the embedded defaults' filesystem broker.
- observability/: structured logs, the metric objects, tracing.
- workers/: a worker process's database connections and garbage-collector tuning.

At the root beside the Django files: env.py (typed environment readers for settings), audit.py (the admin's
audit mixin every ModelAdmin puts first), jsontext.py (checks on users' JSON shared by the API's body parser and
the batch line reader) and windows.py (fixed-window counters for rate limits).

Who may use it: every app and the project modules (settings, urls, celery, wsgi). Inside it, http/, messaging/
and audit.py stand above models.py, observability/ and workers/, never the reverse (contract "Core's floors")."""

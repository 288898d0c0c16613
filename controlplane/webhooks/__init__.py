"""Webhooks as OpenAI sends them: the endpoints a tenant registers (``/v1/webhook_endpoints``, views.py), one
event per terminal batch state (services.py), and its deliveries: each attempt a signed POST (delivery.py) to a
public address only (urlguard.py), retried with backoff from the database (attempts.py), capped per endpoint and
tenant in flight (inflight.py) and pruned (housekeeping.py).

Who may use it: the batch pipeline records events through services.py, and batches' retention sweep runs
housekeeping.py. Delivering is the app's own (pyproject.toml, contract "Webhooks' public surface")."""

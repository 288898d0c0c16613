"""Prometheus metrics, the top floor: the gauges computed from the database at scrape time (collector.py),
Triton's own metrics re-exported under this service's names (triton_scrape.py), the protected ``/metrics``
endpoint (views.py) and a Celery worker's own (worker.py). The counters and histograms the hot path updates live
in core/observability/metrics.py, so that every layer can update them without reaching up.

Who may use it: urls.py (views.py) and controlplane/celery.py (worker.py); the collectors are the app's own
(pyproject.toml, contract "Metrics' public surface")."""

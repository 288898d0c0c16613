"""Prometheus metrics, the top floor: the gauges computed from the database at scrape time (collector.py) and the protected ``/metrics`` endpoint (views.py). The counters and histograms
the hot path updates live in core/observability/metrics.py, so that every layer can update them without reaching up."""

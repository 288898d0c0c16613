"""Prometheus metrics: the counters and histograms the hot path updates (registry.py), the gauges computed
from the database at scrape time (collector.py) and the protected ``/metrics`` endpoint (views.py)."""

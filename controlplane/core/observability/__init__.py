"""What the running processes tell operators:

- logs.py: structured logs whose every line names the batch, shard, attempt and slot it is about (JSON or text).
- metrics.py: the Prometheus metric objects the code updates, per shard or per call, never per line.
- tracing.py: OpenTelemetry, one trace per batch; off (and free) unless an endpoint is set.

Who may use it: any module. None of the three imports Django at import time (gunicorn.conf.py loads logs.py in
gunicorn's master, before settings exist), and metrics.py imports nothing of the control plane. Serving ``/metrics`` and scraping Triton belong to the metrics app, which reads these objects."""

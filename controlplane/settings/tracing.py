"""Settings of tracing (docs/architecture/tracing.md, "Traces"; controlplane/core/observability/tracing.py).
The standard OpenTelemetry variables, read here so a bad value stops start-up instead of silently tracing
nothing."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from controlplane.core.env import env_choice, env_float, env_str
from controlplane.core.observability.tracing import SAMPLERS

TRACING_ENDPOINT = env_str(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "",
    help="The OTLP/HTTP collector's base URL (spans go to its /v1/traces); empty: no tracing.",
)
TRACING_SERVICE_NAME = env_str(
    "OTEL_SERVICE_NAME",
    "controlplane",
    help="Service name of the spans; a process reports as NAME-ROLE (web, worker, beat, manage).",
)
# Decided once per batch, at its create request; every later span of the batch follows that decision.
TRACING_SAMPLER = env_choice(
    "OTEL_TRACES_SAMPLER", "parentbased_always_on", SAMPLERS, help="Which batches (root spans) are traced."
)
TRACING_SAMPLER_RATIO = env_float(
    "OTEL_TRACES_SAMPLER_ARG", 1.0, help="The fraction traced by the ratio samplers, within [0, 1]."
)
if not 0.0 <= TRACING_SAMPLER_RATIO <= 1.0:
    raise ImproperlyConfigured(f"OTEL_TRACES_SAMPLER_ARG must be within [0, 1], got {TRACING_SAMPLER_RATIO}")

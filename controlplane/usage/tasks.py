"""Beat task of the usage ledger: attribute Triton's measured compute time (usage/attribution.py)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from controlplane.triton.client import TritonClient
from controlplane.usage.attribution import usage_attribute


def _read_compute_ns(grpc_url: str, triton_model: str) -> int:
    with TritonClient(grpc_url, timeout_s=settings.FLEET_PROBE_TIMEOUT_SECONDS) as client:
        return client.model_compute_ns(triton_model)


@shared_task(name="usage.attribute")
def usage_attribute_task() -> dict[str, object]:
    report = usage_attribute(now=timezone.now(), read=_read_compute_ns)
    return {"placements": report.placements_read, "records": report.records_attributed, "unreadable": report.unreadable}

"""Per-GPU figures from Triton's Prometheus text: the fleet's GPU inventory on GPU hosts.

Standard library only, on purpose: build_engines/gpu_check.sh loads this file by path on a GPU machine that
has no Django, to check the parser against a real server's /metrics next to what NVML reports.
"""

from __future__ import annotations

import re

_METRIC = re.compile(
    r'^(nv_gpu_memory_total_bytes|nv_gpu_memory_used_bytes|nv_gpu_utilization)\{[^}]*gpu_uuid="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)$'
)


def parse_gpu_metrics(text: str) -> list[dict[str, float]]:
    """Triton's Prometheus text → per-GPU totals, in the order GPUs appear (Triton lists them by index)."""
    by_uuid: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _METRIC.match(line.strip())
        if match:
            by_uuid.setdefault(match.group(2), {})[match.group(1)] = float(match.group(3))
    return list(by_uuid.values())

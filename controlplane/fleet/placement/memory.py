"""Memory that matches reality: what one placed instance holds per GPU, measured where Triton reports it,
with the catalogue's declared figure as the prior.

Triton's model statistics carry ``memory_usage`` per model ({type: GPU|CPU|CPU_PINNED, id, byte_size}; the
TensorRT and ONNX Runtime GPU backends fill it in, int64s arriving as strings in the JSON form). On a CPU
host nothing reports GPU memory, so the declared figure is what the planner uses; tests/fleet/test_memory.py
feeds these functions the statistics a GPU server sends. Pure: no Django."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def measured_bytes_per_gpu(stats: dict[str, Any]) -> dict[int, int]:
    """GPU id -> bytes the model holds there, from one ``model_statistics`` answer (all versions summed)."""
    out: dict[int, int] = {}
    for entry in stats.get("model_stats", []):
        for usage in entry.get("memory_usage", []) or []:
            if str(usage.get("type", "")).upper() != "GPU":
                continue
            gpu = int(usage.get("id", 0) or 0)
            out[gpu] = out.get(gpu, 0) + int(usage.get("byte_size", 0) or 0)
    return out


def measured_bytes_per_instance(stats: dict[str, Any], *, instances: int, gpus: Iterable[int]) -> int | None:
    """What one instance holds on each of its GPUs (the largest over the placement's GPUs), or None when
    Triton reported nothing for them (CPU host, or a backend that does not count)."""
    per_gpu = measured_bytes_per_gpu(stats)
    seen = [per_gpu[g] for g in gpus if per_gpu.get(g)]
    if not seen or instances < 1:
        return None
    return -(-max(seen) // instances)


def planned_bytes_per_instance(declared: int, measured: Iterable[int | None]) -> int:
    """The planner's figure: the largest measurement of any current placement, else the declared prior.
    The largest, since one model's instances on different GPU kinds or after a KV-cache grow may differ and
    placing by the smallest would overcommit."""
    values = [m for m in measured if m]
    return max(values) if values else declared

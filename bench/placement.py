"""Placement benchmark: a two-model workload whose mix changes, on three local Triton servers.

Runs the same workload twice — rebalancing on, and a static placement of one instance per model
(min = max = 1) — and prints lines/s for each, the time from each demand shift to the new placement
serving, and the lines that failed during moves (target 0). `make bench` runs it after bench/run.py."""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import psycopg  # noqa: E402

from deploy.local.fleet import local_fleet  # noqa: E402

GPU_BYTES = 256 * 1024**2


def _jsonl(model: str, n: int, prefix: str) -> io.BytesIO:
    return io.BytesIO(
        b"".join(
            json.dumps(
                {
                    "custom_id": f"{prefix}-{i}",
                    "method": "POST",
                    "url": "/v2/infer",
                    "body": {
                        "model": model,
                        "inputs": [
                            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [float(i), 1.0, 2.0, 3.0]}
                        ],
                    },
                }
            ).encode()
            + b"\n"
            for i in range(n)
        )
    )


def _phase(sdk, mix: dict[str, int], prefix: str) -> list[str]:
    ids = []
    for model, lines in mix.items():
        uploaded = sdk.files.create(file=(f"{prefix}-{model}.jsonl", _jsonl(model, lines, prefix)), purpose="batch")
        ids.append(sdk.batches.create(input_file_id=uploaded.id, endpoint="/v2/infer", completion_window="24h").id)
    return ids


def _wait(sdk, ids: list[str]) -> tuple[int, int]:
    while True:
        batches = [sdk.batches.retrieve(i) for i in ids]
        if all(b.status in ("completed", "failed", "cancelled", "expired") for b in batches):
            return (sum(b.request_counts.completed for b in batches), sum(b.request_counts.failed for b in batches))
        time.sleep(0.25)


def _first_serving(db_url: str, model: str, since: float) -> float | None:
    """Seconds from `since` (epoch) to the first successful load/scale_up of `model`; 0 when it was
    already placed and the planner saw no need to grow it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT min(extract(epoch from e.created_at)) FROM fleet_placementevent e "
            "JOIN fleet_cataloguemodel m ON m.id=e.model_id WHERE m.triton_name=%s AND e.ok "
            "AND e.action IN ('load','scale_up') AND e.created_at >= to_timestamp(%s)",
            (model, since),
        ).fetchone()
    if row[0] is not None:
        return float(row[0]) - since
    with psycopg.connect(db_url, autocommit=True) as conn:
        serving = conn.execute(
            "SELECT count(*) FROM fleet_placement p JOIN fleet_cataloguemodel m ON m.id=p.model_id "
            "WHERE m.triton_name=%s AND p.status='ready' AND p.instances > 0",
            (model,),
        ).fetchone()[0]
    return 0.0 if serving else None  # already had enough capacity: serving from the first moment


def run(static: bool, lines: int) -> dict[str, float]:
    from openai import OpenAI

    env = {
        "SHARD_MAX_LINES": "16",
        "FLEET_RECONCILE_INTERVAL_SECONDS": "2",
        "FLEET_HEARTBEAT_INTERVAL_SECONDS": "1",
        "FLEET_IDLE_TTL_SECONDS": "6",
        "FLEET_PAYBACK_HORIZON_SECONDS": "5",
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        local_fleet(
            Path(tmp), servers=3, gpu_bytes=GPU_BYTES, env=env, broker_url="redis://127.0.0.1:6379/11"
        ) as fleet,
    ):
        if static:
            fleet.stack.manage(
                "shell",
                "-c",
                "from controlplane.fleet.models import CatalogueModel; "
                "CatalogueModel.objects.update(min_instances=1, max_instances=1)",
            )
        sdk = OpenAI(base_url=f"{fleet.stack.base_url}/v1", api_key=fleet.api_key, max_retries=0, timeout=120)
        phases = [{"identity": lines, "scale2": lines // 8}, {"identity": lines // 8, "scale2": lines}]
        done = failed = 0
        shifts = []
        start = time.monotonic()
        for n, mix in enumerate(phases):
            hot = max(mix, key=mix.get)
            since = time.time()
            ok, bad = _wait(sdk, _phase(sdk, mix, f"p{n}"))
            done, failed = done + ok, failed + bad
            shift = _first_serving(fleet.db_url, hot, since)
            shifts.append(shift if shift is not None else float("nan"))
        elapsed = time.monotonic() - start
    return {"lines_per_s": (done + failed) / elapsed, "failed": failed, "shift_s": statistics.mean(shifts)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lines = 800 if args.quick else 2400
    results = {"rebalancing": run(False, lines), "static 1/model": run(True, lines)}
    print(f"\n{'placement':<18}{'lines/s':>10}{'failed lines':>14}{'shift→serving s':>18}")
    for name, r in results.items():
        print(f"{name:<18}{r['lines_per_s']:>10.1f}{r['failed']:>14.0f}{r['shift_s']:>18.1f}")
    ratio = results["rebalancing"]["lines_per_s"] / results["static 1/model"]["lines_per_s"]
    print(f"PLACEMENT rebalancing_vs_static={ratio:.2f} failed_during_moves={results['rebalancing']['failed']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: the whole service on embedded defaults (SQLite, filesystem broker, local storage,
local Triton), driven through the REST API with the official openai SDK."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from openai import OpenAI  # noqa: E402

from deploy.local.stack import DEFAULT_WARM_MODELS, SERVED_LLM, Stack, find_free_port  # noqa: E402

TERMINAL = {"completed", "failed", "cancelled", "expired"}


def main() -> int:
    var_dir = REPO_ROOT / "var" / "demo"
    shutil.rmtree(var_dir, ignore_errors=True)
    # Embedded defaults only: no DATABASE_URL / broker URL, whatever the calling shell has set.
    env = {"DATABASE_URL": "", "CELERY_BROKER_URL": "filesystem://", "STORAGE_BACKEND": "local"}
    # Supervised like `make serve`: a crashed Triton, worker or beat is restarted and the restart logged.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stack = Stack(
        var_dir=var_dir,
        web_port=find_free_port(),
        env=env,
        supervise=True,
        warm_models=(*DEFAULT_WARM_MODELS, SERVED_LLM),
    )
    print(f"starting Triton, web, worker and beat (logs in {stack.log_dir}) ...", flush=True)
    started = time.monotonic()
    with stack:
        print(f"stack up in {time.monotonic() - started:.1f}s at {stack.base_url}", flush=True)
        key = stack.manage("tenant_create", "demo").stdout.strip().splitlines()[-1]
        client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key)
        batches = []
        for path in sorted((REPO_ROOT / "examples").glob("*.jsonl")):
            with path.open("rb") as fh:
                uploaded = client.files.create(file=(path.name, fh), purpose="batch")
            endpoint = json.loads(path.open().readline())["url"]
            batch = client.batches.create(
                input_file_id=uploaded.id,
                endpoint=endpoint,
                completion_window="24h",  # type: ignore[arg-type]
                metadata={"example": path.name},
            )
            print(f"submitted {path.name}: file {uploaded.id}, batch {batch.id} ({endpoint})", flush=True)
            batches.append(batch)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            current = [client.batches.retrieve(b.id) for b in batches]
            line = "  ".join(
                f"{b.metadata['example']}: {b.status} {b.request_counts.completed + b.request_counts.failed}"
                f"/{b.request_counts.total}"
                if b.request_counts
                else f"{b.metadata['example']}: {b.status}"
                for b in current
            )
            print(f"[{time.monotonic() - started:6.1f}s] {line}", flush=True)
            if all(b.status in TERMINAL for b in current):
                break
            time.sleep(1)
        ok = True
        for batch in current:
            print(f"\n== {batch.metadata['example']}: {batch.status}, {batch.request_counts}")
            if batch.errors:
                print(f"   errors: {batch.errors}")
            if batch.output_file_id:
                content = client.files.content(batch.output_file_id).text.splitlines()
                out_dir = var_dir / "results"
                out_dir.mkdir(exist_ok=True)
                target = out_dir / f"{batch.id}_output.jsonl"
                target.write_text("\n".join(content) + "\n")
                print(f"   output file {batch.output_file_id}: {len(content)} lines, saved to {target}")
                # Every answer of the chat example (the real LLM's); the first three lines of the others.
                shown = content if batch.endpoint == "/v1/chat/completions" else content[:3]
                for raw in shown:
                    record = json.loads(raw)
                    print("   " + _summary(record))
            ok = ok and batch.status == "completed" and batch.request_counts.failed == 0
    print("\nstack stopped.", "demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


def _summary(record: dict) -> str:
    body = record["response"]["body"]
    if body.get("object") == "chat.completion":
        answers = " | ".join(f"{c['message']['content']!r} ({c['finish_reason']})" for c in body["choices"])
        return f"{record['custom_id']}: {answers}, usage {body['usage']['total_tokens']} tokens"
    if "data" in body:
        first = body["data"][0]["embedding"]
        return (
            f"{record['custom_id']}: {len(body['data'])} embedding(s) of {len(first)} dims, "
            f"first values {[round(v, 4) for v in first[:4]]}, usage {body['usage']}"
        )
    out = body["outputs"][0]
    return f"{record['custom_id']}: {out['name']} shape {out['shape']} data {out['data'][:4]}"


if __name__ == "__main__":
    sys.exit(main())

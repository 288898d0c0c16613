"""batchctl's tokens line for generation batches: tokens generated, tokens/s while running, an ETA."""

from __future__ import annotations

from openai.types import Batch

from batchctl.render import batch_panel, generation_text


def _batch(endpoint: str = "/v1/chat/completions", **fields) -> Batch:
    base = {
        "id": "batch_1",
        "object": "batch",
        "endpoint": endpoint,
        "input_file_id": "file-1",
        "completion_window": "24h",
        "status": "in_progress",
        "created_at": 1000,
        "in_progress_at": 1000,
        "request_counts": {"total": 100, "completed": 20, "failed": 5},
        "usage": {
            "input_tokens": 900,
            "output_tokens": 500,
            "total_tokens": 1400,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    return Batch.model_validate({**base, **fields})


def test_a_running_generation_batch_shows_its_rate_and_eta():
    # 500 tokens in 10 s; 25 of 100 lines in 10 s: 75 left take ~30 s more.
    assert generation_text(_batch(), now=1010) == "500 generated, 50.0 tokens/s, ETA ~30 s"


def test_a_finished_batch_rates_to_when_it_stopped_running():
    batch = _batch(status="completed", finalizing_at=1020, completed_at=1021)
    assert generation_text(batch, now=5000) == "500 generated, 25.0 tokens/s"


def test_other_endpoints_and_waiting_batches():
    assert generation_text(_batch("/v1/embeddings"), now=1010) is None
    assert generation_text(_batch(status="validating", in_progress_at=None), now=1010) == "500 generated"


def test_the_status_panel_carries_it():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(batch_panel(_batch(), now=1010))
    row = next(line for line in console.export_text().splitlines() if " tokens " in line)
    assert "500 generated, 50.0 tokens/s, ETA ~30 s" in row

"""What `--wait` ends with: the batch's files on disk and an exit code that says how it ended."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from batchctl.console import err, out
from batchctl.download import results_download
from batchctl.errors import EXIT_BATCH_NOT_COMPLETED, EXIT_INTERRUPTED, EXIT_OK
from batchctl.render import batch_errors, counts
from batchctl.waiting import batch_wait

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch


def downloads_report(downloaded: list[tuple[str, Path, int]]) -> None:
    for kind, path, size in downloaded:
        out.print(f"{kind}: {escape(str(path))} ({size:,} bytes)")


def batch_conclude(client: OpenAI, batch: Batch, output_dir: Path) -> int:
    """Download what the ended batch has (cancelled and expired batches keep their finished lines), say
    how it went, and return 0 only for a completed batch."""
    downloaded = results_download(client, batch, output_dir)
    downloads_report(downloaded)
    completed, failed, total = counts(batch)
    if batch.status == "completed":
        out.print(f"[bold green]completed[/]: {completed} lines done, {failed} failed of {total}")
        if failed:
            out.print(f"re-run the failed lines with: batchctl retry-failed {batch.id}")
        return EXIT_OK
    if batch.status == "failed":
        err.print(f"[bold red]batch {batch.id} failed[/]")
        for error in batch_errors(batch):
            where = f"line {error.line}: " if error.line else ""
            err.print(f"  {where}{escape(error.message or '')} ({error.code})")
        return EXIT_BATCH_NOT_COMPLETED
    err.print(
        f"[bold yellow]batch {batch.id} {batch.status}[/]: {completed} of {total} lines done, {failed} failed"
        + ("; the finished lines are downloaded" if downloaded else "")
    )
    return EXIT_BATCH_NOT_COMPLETED


def wait_and_conclude(client: OpenAI, batch_id: str, *, output_dir: Path, poll_seconds: float) -> int:
    """Follow the batch to its end, then conclude. Ctrl-C stops following, never the batch."""
    try:
        batch = batch_wait(client, batch_id, console=out, poll_seconds=poll_seconds)
    except KeyboardInterrupt:
        err.print(
            f"\nstopped waiting; {batch_id} keeps running.\n"
            f"  follow it:  batchctl status {batch_id}\n  cancel it:  batchctl cancel {batch_id}"
        )
        return EXIT_INTERRUPTED
    return batch_conclude(client, batch, output_dir)

"""How batches and models look on a terminal (rich renderables) and to scripts (JSON). Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from openai import BaseModel
    from openai.types import Batch, BatchError, Model

TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
STATUS_STYLES = {
    "validating": "cyan",
    "in_progress": "blue",
    "finalizing": "blue",
    "completed": "green",
    "failed": "red",
    "expired": "yellow",
    "cancelling": "yellow",
    "cancelled": "yellow",
}
# The moments a batch passes through, in lifecycle order, as (field, label).
TIMELINE = (
    ("created_at", "created"),
    ("in_progress_at", "in progress"),
    ("finalizing_at", "finalizing"),
    ("completed_at", "completed"),
    ("failed_at", "failed"),
    ("cancelling_at", "cancelling"),
    ("cancelled_at", "cancelled"),
    ("expired_at", "expired"),
    ("expires_at", "expires"),
)


def extra(model: BaseModel, name: str) -> Any:
    """A field this service adds to OpenAI's object (``priority``, ``queue``, ``kind``...), or None."""
    return (model.model_extra or {}).get(name)


def timestamp(value: int | None, *, short: bool = False) -> str:
    """UTC, like the service's buckets and deadlines; ``short`` (minutes, no zone) for table columns."""
    if value is None:
        return "–"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S UTC")


def counts(batch: Batch) -> tuple[int, int, int]:
    """(completed, failed, total) lines; zeros while the server has not counted them yet."""
    rc = batch.request_counts
    return (rc.completed, rc.failed, rc.total) if rc is not None else (0, 0, 0)


def batch_errors(batch: Batch) -> list[BatchError]:
    return list(batch.errors.data or []) if batch.errors else []


def progress_text(batch: Batch) -> str:
    completed, failed, total = counts(batch)
    share = f" ({100 * (completed + failed) // total}%)" if total else ""
    return f"{completed} done, {failed} failed of {total}{share}"


GENERATION_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})


def generation_text(batch: Batch, *, now: float) -> str | None:
    """Generated tokens, tokens/s since the batch started running, and an ETA from its lines/s so far (None
    for other endpoints). The rate runs to ``now`` while it runs, to when it stopped running after."""
    if batch.endpoint not in GENERATION_ENDPOINTS or batch.usage is None:
        return None
    tokens = batch.usage.output_tokens
    text = f"{tokens:,} generated"
    started = batch.in_progress_at
    if started is None:
        return text
    ended = batch.finalizing_at or batch.cancelling_at or batch.expired_at or batch.failed_at
    elapsed = (ended if ended is not None else now) - started
    if elapsed <= 0:
        return text
    text += f", {tokens / elapsed:,.1f} tokens/s"
    completed, failed, total = counts(batch)
    done = completed + failed
    if ended is None and 0 < done < total:
        text += f", ETA ~{(total - done) * elapsed / done:,.0f} s"
    return text


def status_text(status: str) -> Text:
    return Text(status, style=f"bold {STATUS_STYLES.get(status, '')}".strip())


def queue_text(queue: Any) -> str:
    """The service's ``queue`` field: where the batch waits among its model's runnable batches."""
    if not isinstance(queue, dict):
        return "not waiting"
    text = f"position {queue.get('position')} of {queue.get('runnable_batches')}"
    start = queue.get("estimated_start_at")
    text += f", estimated start {timestamp(start)}" if isinstance(start, int) else ", start not estimable"
    return text + (", deadline at risk" if queue.get("deadline_at_risk") else "")


def batch_panel(batch: Batch, *, now: float | None = None) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("status", status_text(batch.status))
    grid.add_row("lines", progress_text(batch))
    generation = generation_text(batch, now=datetime.now(UTC).timestamp() if now is None else now)
    if generation is not None:
        grid.add_row("tokens", generation)
    grid.add_row("endpoint", batch.endpoint + (f"  (model {batch.model})" if batch.model else ""))
    grid.add_row("priority", str(extra(batch, "priority") or "–"))
    if batch.status in ("validating", "in_progress"):
        grid.add_row("queue", queue_text(extra(batch, "queue")))
    for field, label in TIMELINE:
        value = getattr(batch, field)
        if value is not None:
            grid.add_row(label, timestamp(value))
    grid.add_row("input file", batch.input_file_id)
    grid.add_row("output file", batch.output_file_id or "–")
    grid.add_row("error file", batch.error_file_id or "–")
    if extra(batch, "rerun_of"):
        grid.add_row("re-runs", str(extra(batch, "rerun_of")))
    if batch.metadata:
        grid.add_row("metadata", ", ".join(f"{k}={v}" for k, v in batch.metadata.items()))
    parts: list[RenderableType] = [grid]
    errors = batch_errors(batch)
    if errors:
        parts.append(Text("\nerrors", style="bold red"))
        parts.extend(Text(f"  line {e.line}: " if e.line else "  ") + Text(f"{e.message} ({e.code})") for e in errors)
    return Panel(Group(*parts), title=f"[bold]{escape(batch.id)}[/]", title_align="left", expand=False)


def batches_table(batches: Iterable[Batch]) -> Table:
    table = Table(box=None, header_style="bold")
    # No endpoint column: the model implies it (batchctl models). Id, status, lines and time never wrap, so each
    # batch stays one greppable line; on a narrow terminal (80 columns) rich drops model and priority instead.
    for name in ("ID", "STATUS", "MODEL", "PRIORITY", "LINES", "CREATED (UTC)"):
        table.add_column(name, no_wrap=name not in ("MODEL", "PRIORITY"))
    for batch in batches:
        completed, failed, total = counts(batch)
        table.add_row(
            batch.id,
            status_text(batch.status),
            batch.model or "–",
            str(extra(batch, "priority") or "–"),
            f"{completed + failed}/{total}" + (f" ({failed} failed)" if failed else ""),
            timestamp(batch.created_at, short=True),
        )
    return table


def models_table(models: Iterable[Model]) -> Table:
    table = Table(box=None, header_style="bold")
    for name in ("MODEL", "KIND", "ENDPOINT", "MAX BATCH", "SHAPE"):
        table.add_column(name, no_wrap=name == "MODEL")
    for model in models:
        dims = extra(model, "embedding_dimensions")
        inputs = extra(model, "inputs") or []
        shape = f"{dims}-dim vectors" if dims else ", ".join(_tensor(spec) for spec in inputs if isinstance(spec, dict))
        table.add_row(
            model.id,
            str(extra(model, "kind") or "–"),
            str(extra(model, "endpoint") or "–"),
            str(extra(model, "max_batch_size") or "–"),
            shape or "–",
        )
    return table


def _tensor(spec: dict[str, Any]) -> str:
    return f"{spec.get('name')} {spec.get('datatype')}{spec.get('dims') or spec.get('shape') or ''}"


def as_json(value: BaseModel | Iterable[BaseModel]) -> str:
    """The objects as the server sent them (extra fields included), for scripts and jq."""
    from openai import BaseModel  # the SDK's models: only the commands that hold them come here

    if isinstance(value, BaseModel):
        return json.dumps(value.to_dict(), indent=2)
    return json.dumps([item.to_dict() for item in value], indent=2)

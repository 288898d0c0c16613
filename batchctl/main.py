"""`batchctl`: submit and follow batches from a shell. Each command is thin: parse, one or two API calls
through the openai SDK, render (render.py), exit with a code scripts can branch on (errors.py)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from json import dumps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast
from urllib.parse import quote

import typer
from rich.markup import escape

from batchctl.config import DEFAULT_BASE_URL, Settings, client_create, settings_resolve
from batchctl.console import out
from batchctl.download import results_download
from batchctl.errors import (
    EXIT_BATCH_NOT_COMPLETED,
    EXIT_INTERRUPTED,
    EXIT_UNSUPPORTED,
    fail,
    reports_api_errors,
)
from batchctl.follow import STREAMS, CursorMismatch, FollowAPI, follow, sink_open
from batchctl.options import BatchStatus, BucketWidth, Priority, UsageReport, idempotency_headers, metadata_parse
from batchctl.outcome import downloads_report, wait_and_conclude
from batchctl.render import TERMINAL_STATUSES, as_json, batch_panel, batches_table, models_table
from batchctl.usage import REPORT_PATHS, time_parse, usage_buckets, usage_csv, usage_table

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch

app = typer.Typer(
    name="batchctl",
    help="Submit, follow and collect batch inference jobs. The key comes from --api-key, $BATCHCTL_API_KEY or "
    f"$OPENAI_API_KEY; the API from --base-url, $BATCHCTL_BASE_URL or $OPENAI_BASE_URL (else {DEFAULT_BASE_URL}).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Options shared by several commands.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the raw JSON objects (for scripts).")]
OutputDir = Annotated[Path, typer.Option("--output-dir", "-o", help="Where the output and error files go.")]
Wait = Annotated[bool, typer.Option("--wait", "-w", help="Follow progress, then download the results.")]
# One retrieve a second: a live bar, and far below the per-key request rate (3,000 a minute by default).
PollInterval = Annotated[float, typer.Option("--poll-interval", min=0.1, help="Seconds between status polls.")]


@dataclass(frozen=True)
class Connection:
    api_key: str | None
    base_url: str | None

    def settings(self) -> Settings:
        return settings_resolve(api_key=self.api_key, base_url=self.base_url, environ=os.environ)

    def client(self) -> OpenAI:
        return client_create(self.settings())


def _client(ctx: typer.Context) -> OpenAI:
    return cast(Connection, ctx.obj).client()


@app.callback()
def connection(
    ctx: typer.Context,
    api_key: Annotated[str | None, typer.Option("--api-key", help="API key (sk-cp-...).", show_default=False)] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="API root, ending in /v1.")] = None,
) -> None:
    ctx.obj = Connection(api_key=api_key, base_url=base_url)


@app.command()
@reports_api_errors
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="JSONL input file.")],
    endpoint: Annotated[str, typer.Option(help="/v1/embeddings or /v2/infer (the lines' url).")],
    completion_window: Annotated[str, typer.Option(help="Deadline for the whole batch.")] = "24h",
    priority: Annotated[Priority | None, typer.Option(help="Scheduling class (default: normal).")] = None,
    metadata: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
    wait: Wait = False,
    output_dir: OutputDir = Path("."),
    poll_interval: PollInterval = 1.0,
) -> None:
    """Upload FILE and create a batch from it; with --wait, follow it and download its results."""
    import openai

    tags = metadata_parse(metadata)
    client = _client(ctx)
    with file.open("rb") as stream:
        uploaded = client.files.create(file=(file.name, stream), purpose="batch", extra_headers=idempotency_headers())
    out.print(f"uploaded {escape(str(file))} as {uploaded.id} ({uploaded.bytes:,} bytes)")
    try:
        batch = client.batches.create(
            input_file_id=uploaded.id,
            # The SDK's type lists OpenAI's endpoints; this service adds /v2/infer and checks the value itself.
            endpoint=cast(Any, endpoint),
            completion_window=cast(Any, completion_window),
            metadata=tags,
            extra_body={"priority": priority.value} if priority else None,
            extra_headers=idempotency_headers(),
        )
    except openai.APIStatusError:
        # A refused create (bad endpoint, priority, quota) leaves no upload behind to count against storage.
        # Only on a definite answer: after a lost connection the batch may exist, and it needs its input.
        with contextlib.suppress(openai.OpenAIError):
            client.files.delete(uploaded.id)
        raise
    out.print(f"created {batch.id} ({batch.status})")
    if not wait:
        out.print(f"follow it with: batchctl status {batch.id}")
        return
    raise typer.Exit(wait_and_conclude(client, batch.id, output_dir=output_dir, poll_seconds=poll_interval))


@app.command()
@reports_api_errors
def status(ctx: typer.Context, batch_id: str, json: JsonFlag = False) -> None:
    """A batch's status, line counts, priority, queue position and errors."""
    batch = _client(ctx).batches.retrieve(batch_id)
    if json:
        typer.echo(as_json(batch))
    else:
        out.print(batch_panel(batch), soft_wrap=False)


@app.command("list")
@reports_api_errors
def list_batches(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="At most this many batches, newest first.")] = 20,
    status: Annotated[BatchStatus | None, typer.Option(help="Only batches in this status.")] = None,
    json: JsonFlag = False,
) -> None:
    """Your batches, newest first."""
    # The API has no status filter (as on OpenAI): filtered, read full pages (100 is the API's maximum).
    page = _client(ctx).batches.list(limit=min(limit, 100) if status is None else 100)
    found: list[Batch] = []
    for batch in page:  # the SDK follows the `after` cursor page by page
        if status is None or batch.status == status.value:
            found.append(batch)
            if len(found) >= limit:
                break
    if json:
        typer.echo(as_json(found))
    elif found:
        out.print(batches_table(found), soft_wrap=False)
    else:
        out.print("no batches" + (f" in status {status.value}" if status else ""))


@app.command()
@reports_api_errors
def cancel(ctx: typer.Context, batch_id: str) -> None:
    """Cancel a batch; lines already finished stay in its output file."""
    batch = _client(ctx).batches.cancel(batch_id)
    out.print(f"{batch.id}: {batch.status}; what finished stays downloadable: batchctl download {batch.id}")


@app.command()
@reports_api_errors
def download(ctx: typer.Context, batch_id: str, output_dir: OutputDir = Path(".")) -> None:
    """Download an ended batch's output and error files (streamed to disk)."""
    client = _client(ctx)
    batch = client.batches.retrieve(batch_id)
    if batch.status not in TERMINAL_STATUSES:
        raise fail(f"{batch.id} is {batch.status}; its output and error files are written when it ends.")
    downloaded = results_download(client, batch, output_dir)
    if not downloaded:
        raise fail(f"{batch.id} is {batch.status} and has no output or error file (see: batchctl status {batch.id}).")
    downloads_report(downloaded)


@app.command("follow")
@reports_api_errors
def follow_batch(
    ctx: typer.Context,
    batch_id: str,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="The output lines' file (default: BATCH_output.jsonl).")
    ] = None,
    errors: Annotated[
        Path | None,
        typer.Option("--errors", "-e", help="The error lines' file (default: beside -o, BATCH_errors.jsonl)."),
    ] = None,
    poll_interval: PollInterval = 1.0,
    give_up_after: Annotated[
        float, typer.Option(min=1, help="Stop after this many seconds without reaching the API.")
    ] = 300.0,
) -> None:
    """Write a batch's output and error lines to files as its shards finish, with a progress bar; run it
    again with the same files to resume (each keeps its cursor in FILE.cursor). Ctrl-C stops following, never
    the batch."""
    output = output or Path(f"{batch_id}_output.jsonl")
    errors = errors or output.with_name(f"{batch_id}_errors.jsonl")
    if output.resolve() == errors.resolve():
        raise typer.BadParameter("--output and --errors must be two files.")
    api = FollowAPI(cast(Connection, ctx.obj).settings())
    try:
        sinks = [
            sink_open(path, batch_id=batch_id, stream=s) for s, path in zip(STREAMS, (output, errors), strict=True)
        ]
    except CursorMismatch as mismatch:
        raise fail(str(mismatch)) from None
    try:
        batch = follow(api, batch_id, sinks, console=out, poll_seconds=poll_interval, give_up_after=give_up_after)
    except KeyboardInterrupt:
        out.print(f"\nstopped following; run the same command again to resume ({batch_id} keeps running).")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        for sink in sinks:
            sink.close()
        api.close()
    if batch is None:
        raise fail(f"the API could not be reached for {give_up_after:.0f} s; run the same command again to resume.")
    for sink in sinks:
        out.print(f"{sink.stream}: {escape(str(sink.path))} ({sink.cursor:,} lines)")
    out.print(f"{batch.id} {batch.status}")
    if batch.status != "completed":
        raise typer.Exit(EXIT_BATCH_NOT_COMPLETED)


@app.command("retry-failed")
@reports_api_errors
def retry_failed(
    ctx: typer.Context,
    batch_id: str,
    error_code: Annotated[
        list[str] | None, typer.Option(help="Only lines that failed with this code (repeatable).")
    ] = None,
    completion_window: Annotated[str | None, typer.Option(help="Deadline (default: the batch's own).")] = None,
    wait: Wait = False,
    output_dir: OutputDir = Path("."),
    poll_interval: PollInterval = 1.0,
) -> None:
    """Re-run an ended batch's failed lines as a new batch (POST /v1/batches/{id}/rerun)."""
    from openai.types import Batch

    client = _client(ctx)
    body: dict[str, Any] = {}
    if error_code:
        body["error_codes"] = error_code
    if completion_window:
        body["completion_window"] = completion_window
    rerun = client.post(
        f"/batches/{quote(batch_id, safe='')}/rerun",
        body=body,
        cast_to=Batch,
        options={"headers": idempotency_headers()},
    )
    out.print(f"created {rerun.id} ({rerun.status}) from the failed lines of {batch_id}")
    if wait:
        raise typer.Exit(wait_and_conclude(client, rerun.id, output_dir=output_dir, poll_seconds=poll_interval))


@app.command()
@reports_api_errors
def models(ctx: typer.Context, json: JsonFlag = False) -> None:
    """The models a batch may name, with their endpoint and tensor shapes."""
    found = list(_client(ctx).models.list())
    if json:
        typer.echo(as_json(found))
    else:
        out.print(models_table(found), soft_wrap=False)


@app.command()
@reports_api_errors
def usage(
    ctx: typer.Context,
    start: Annotated[str, typer.Option(help="Unix seconds, 7d / 12h / 30m ago, or ISO 8601 (UTC).")] = "7d",
    end: Annotated[str | None, typer.Option(help="Exclusive end, same forms (default: now).")] = None,
    bucket_width: Annotated[BucketWidth, typer.Option(help="Width of each time bucket.")] = BucketWidth.day,
    group_by: Annotated[list[str] | None, typer.Option(help="model, api_key_id, batch... (repeatable).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Buckets per page (server default otherwise).")] = None,
    json: JsonFlag = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (one row per bucket and group).")] = False,
    report: Annotated[UsageReport, typer.Option(help="Token usage, tensor rows, or costs.")] = UsageReport.embeddings,
) -> None:
    """Your usage or costs per time bucket (GET /v1/organization/usage/embeddings, …/usage/tensors or
    /v1/organization/costs: OpenAI's organization usage API shape)."""
    import openai

    now = datetime.now(UTC)
    try:
        start_time = time_parse(start, now=now)
        end_time = time_parse(end, now=now) if end else None
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    client = _client(ctx)
    try:
        buckets = usage_buckets(
            client,
            start_time=start_time,
            end_time=end_time,
            bucket_width=bucket_width.value,
            group_by=group_by or [],
            limit=limit,
            report=report.value,
        )
    except openai.NotFoundError:
        url = str(client.base_url).rstrip("/") + REPORT_PATHS[report.value]
        raise fail(f"this server has no usage API yet: GET {url} answered 404.", EXIT_UNSUPPORTED) from None
    if json:
        typer.echo(dumps({"object": "list", "data": buckets}, indent=2))
    elif as_csv:
        typer.echo(usage_csv(buckets), nl=False)
    elif any(bucket.get("results") for bucket in buckets):
        out.print(usage_table(buckets), soft_wrap=False)
    else:
        out.print(f"no usage between {start} and {end or 'now'} ({len(buckets)} buckets, all empty)")

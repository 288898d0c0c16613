"""Generation shard columns: each line of a shard as validation parsed it, so the shard's run does not apply the
chat template and the tokenizer again.

Validation parses every generation line with the model's tokenizer (the chat template's text, the prompt's
token ids, every field checked); reading the shard's lines from the input file and parsing them once more at
run time costs ~2 ms a line of the shard worker's CPU on tinylm (docs/performance.md, "Generation on tinylm").
So validation keeps each shard's parsed lines (``GenerationLine``: the request, its work units)
or refused lines (their BodyIssue) in one blob, written when the shard closes, before its row exists; the run
loads them (``generation_columns_load``).

Like the tensor kind's columns (kinds/tensors/columns.py), an optimisation, never a source of truth the run
depends on: a shard without columns (``Shard.columns_name`` blank: validated before this existed, or columns
off), or whose blob is missing, unreadable or not this shard's and model's, parses its lines as before (logged).
The blob shares the tensor columns' name and lifecycle (``parts/<batch>/<index>.columns<attempt>.bin``, deleted
with the shard's parts and when validation fails).

Format: ``MAGIC``, then one JSON document: ``{"model": name, "lines": [[number, custom_id, request, units,
issue], ...]}`` with ``request`` GenerationRequest's fields by name (null for a refused line; a ``/v1/responses``
line's ResponsesRequest adds its ``echo``) and ``issue`` the refused line's [code, message, param] (else null).
"""

from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Callable
from typing import IO, Any

import orjson

from controlplane.files.storage import blob_open
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import BodyIssue, ParsedLine
from controlplane.kinds.generation.bodies import GenerationRequest
from controlplane.kinds.generation.fields import ResponseFormat
from controlplane.kinds.generation.responses import ResponseEcho, ResponsesRequest
from controlplane.kinds.generation.tools import FunctionTool, ToolChoice
from controlplane.kinds.generation.units import GenerationLine
from controlplane.kinds.tensors.columns import ColumnsUnusable, columns_name

__all__ = ["GenerationColumnCollector", "generation_columns_decode", "generation_columns_load"]

logger = logging.getLogger(__name__)

MAGIC = b"CPGENCOLS1\n"
_FIELDS = tuple(field.name for field in dataclasses.fields(GenerationRequest))


def _request_row(request: GenerationRequest) -> dict[str, Any]:
    row = {name: getattr(request, name) for name in _FIELDS}
    row["response_format"] = dataclasses.asdict(request.response_format)
    row["tools"] = [dataclasses.asdict(tool) for tool in request.tools]
    row["tool_choice"] = dataclasses.asdict(request.tool_choice)
    if isinstance(request, ResponsesRequest):
        row["echo"] = dataclasses.asdict(request.echo)
    return row


def _request_from_row(row: dict[str, Any]) -> GenerationRequest:
    """The request as it was parsed: the tuples JSON made lists of are tuples again."""
    echo = row.get("echo")
    fields = {name: value for name, value in row.items() if name != "echo"}
    if set(fields) != set(_FIELDS):
        raise ColumnsUnusable("a line's request has other fields than GenerationRequest's")
    metadata = row["metadata"]
    values: dict[str, Any] = {
        **fields,
        "prompt_token_ids": tuple(row["prompt_token_ids"]),
        "stop": tuple(row["stop"]),
        "metadata": None if metadata is None else tuple((str(k), str(v)) for k, v in metadata),
        "response_format": ResponseFormat(**row["response_format"]),
        "tools": tuple(FunctionTool(**tool) for tool in row["tools"]),
        "tool_choice": ToolChoice(**row["tool_choice"]),
    }
    if echo is None:
        return GenerationRequest(**values)
    return ResponsesRequest(**values, echo=ResponseEcho(**echo))


def generation_columns_encode(model_name: str, lines: list[tuple[int, ParsedLine]]) -> bytes:
    rows = []
    for number, parsed in lines:
        if parsed.issue is not None:
            issue = parsed.issue
            rows.append([number, parsed.custom_id, None, 0, [issue.code, issue.message, issue.param]])
        else:
            line = parsed.request
            assert isinstance(line, GenerationLine)
            rows.append([number, parsed.custom_id, _request_row(line.request), line.units, None])
    return MAGIC + orjson.dumps({"model": model_name, "lines": rows})


def generation_columns_decode(data: bytes) -> tuple[str, dict[int, ParsedLine]]:
    """(the model the lines were parsed for, the lines); raises ColumnsUnusable on anything but a whole blob."""
    if not data.startswith(MAGIC):
        raise ColumnsUnusable("not a generation columns blob")
    try:
        document = orjson.loads(data[len(MAGIC) :])
        model_name = str(document["model"])
        lines: dict[int, ParsedLine] = {}
        for number, custom_id, request, units, issue in document["lines"]:
            if issue is not None:
                code, message, param = issue
                lines[int(number)] = ParsedLine(custom_id, model_name, None, BodyIssue(code, message, param))
            else:
                parsed = GenerationLine(_request_from_row(request), int(units))
                # The line's own body.model: a LoRA adapter line (`base:adapter`) keeps its adapter.
                lines[int(number)] = ParsedLine(custom_id, parsed.request.model, parsed)
    except ColumnsUnusable:
        raise
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:  # truncated, garbled, a bad row
        raise ColumnsUnusable(f"unreadable generation columns blob: {exc}") from exc
    return model_name, lines


class GenerationColumnCollector:
    """Validation's side (kinds/base.ColumnCollector): fed each line of the open shard as the checked parse
    left it (``add_parsed``), it writes the shard's lines when the shard closes."""

    def __init__(self, model: CatalogueModel, *, batch_id: str, attempt: int, save: Callable[[str, IO[bytes]], Any]):
        self.model_name = model.name
        self.batch_id, self.attempt, self._save = batch_id, attempt, save
        self.written: list[str] = []
        self._reset()

    def _reset(self) -> None:
        self._spoiled = False
        self._lines: list[tuple[int, ParsedLine]] = []

    def spoil(self) -> None:
        self._spoiled = True

    def add(self, number: int, custom_id: str, body: dict[str, Any]) -> None:
        # The fast lane has no generation rules (no quick_units): a body without its parse cannot be kept.
        self._spoiled = True

    def add_parsed(self, number: int, parsed: ParsedLine) -> None:
        if not self._spoiled:
            self._lines.append((number, parsed))

    def close(self, *, index: int, request_count: int) -> str:
        """End the open shard: its columns' blob name, or "" when it has none."""
        try:
            if self._spoiled or len(self._lines) != request_count:
                return ""
            name = columns_name(self.batch_id, index, self.attempt)
            self._save(name, io.BytesIO(generation_columns_encode(self.model_name, self._lines)))
            self.written.append(name)
            return name
        finally:
            self._reset()


def generation_columns_load(
    *, name: str, first_line: int, last_line: int, request_count: int, model: CatalogueModel
) -> dict[int, ParsedLine] | None:
    """A shard's parsed lines from its columns (blob ``name``) when they are this shard's, for ``model`` (the
    batch's pinned entry), else None (logged): the caller parses the shard's lines instead."""
    if not name:
        return None
    try:
        with blob_open(name) as stream:
            model_name, lines = generation_columns_decode(stream.read())
        if model_name != model.name:
            raise ColumnsUnusable(f"lines parsed for model {model_name!r}, not {model.name!r}")
        if len(lines) != request_count or any(not first_line <= number <= last_line for number in lines):
            raise ColumnsUnusable(f"{len(lines)} lines for a shard of {request_count} ({first_line}..{last_line})")
    except (OSError, ColumnsUnusable) as exc:
        logger.warning("columns %s not used (%s); parsing its lines", name, exc)
        return None
    return lines

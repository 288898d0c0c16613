"""The generic tensor kind, ``/v2/infer``: a KServe v2 inference request (plus "model") as a line's body, for
any Triton model in the catalogue, so non-text models can be batched too. Work units are rows.

The modules of this package it binds to the endpoint-kind interface (kinds/base.py) are listed in its
``__init__``."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any, ClassVar

import numpy as np

from controlplane.fleet.models import CatalogueModel, ModelKind
from controlplane.kinds.base import Call, LedgerUnits, LineOutput, Member, ParsedLine, TokenCounts
from controlplane.kinds.calls import CallKind
from controlplane.kinds.tensors.columns import ColumnCollector, columns_load
from controlplane.kinds.tensors.fast import ValidatedTensorLines
from controlplane.kinds.tensors.packing import call_rows, pack_tensors, tensor_body
from controlplane.kinds.tensors.quick import TensorQuickLane
from controlplane.kinds.tensors.requests import RawTensorRequest, TensorRequest, tensor_request_parse


class TensorKind(CallKind):
    url: ClassVar[str] = "/v2/infer"
    model_kind: ClassVar[str] = ModelKind.TENSOR
    counts_tokens: ClassVar[bool] = False

    def parse_body(self, body: dict[str, Any], *, model: CatalogueModel) -> TensorRequest:
        return tensor_request_parse(body, model)

    def work_units(self, request: TensorRequest | RawTensorRequest) -> int:
        return request.rows

    def quick_units(self, model: CatalogueModel) -> Callable[[dict[str, Any]], int | None]:
        return TensorQuickLane(model).rows

    def fast_parser(self, model: CatalogueModel) -> Callable[[bytes], ParsedLine | None]:
        return ValidatedTensorLines(model).parse

    def columns_collector(
        self, model: CatalogueModel, *, batch_id: str, attempt: int, save: Callable[[str, IO[bytes]], Any]
    ) -> ColumnCollector | None:
        if not ColumnCollector.suits(model):
            return None
        return ColumnCollector(model, batch_id=batch_id, attempt=attempt, save=save)

    def columns_run(
        self, *, name: str, first_line: int, last_line: int, request_count: int, model: CatalogueModel
    ) -> tuple[dict[int, ParsedLine], list[Call]] | None:
        columns = columns_load(
            name=name, first_line=first_line, last_line=last_line, request_count=request_count, model=model
        )
        if columns is None:
            return None
        # Every line names the batch's model (validation refuses mixed models): the pinned entry's name.
        lines = {n: ParsedLine(c, model.name, None) for n, c in zip(columns.numbers, columns.custom_ids, strict=True)}
        return lines, columns.calls(model.rows_per_call, [spec["name"] for spec in model.outputs])

    def pack(
        self, lines: dict[int, ParsedLine], *, max_batch_size: int, min_calls: int, equal_cost: bool
    ) -> list[Call]:
        # min_calls and equal_cost are for texts (spreading a small shard over instances); rows stack as they come.
        return pack_tensors(lines, max_batch_size)

    def call_pieces(self, call: Call, outputs: dict[str, np.ndarray]) -> list[tuple[Member, Any]]:
        rows = call_rows(outputs)  # converted once per call, not per line
        return [(m, (rows, m)) for m in call.members]

    def render(self, parsed: ParsedLine, pieces: dict[int, Any]) -> LineOutput:
        rows, member = pieces[0]
        return LineOutput(tensor_body(parsed.model_name, rows, member))

    def ledger_units(
        self, *, completed: int, runnable: int, estimated_work_units: int, measured: TokenCounts
    ) -> LedgerUnits:
        # Rows are what validation counted, scaled to the lines that completed (a stopped shard ran only
        # some of them; refused lines have no rows and are not in ``runnable``).
        return LedgerUnits(tokens=0, rows=estimated_work_units * completed // runnable if runnable else 0)

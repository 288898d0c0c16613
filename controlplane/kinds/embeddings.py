"""The embeddings kind, ``/v1/embeddings``: OpenAI's embeddings request and response. Work units are tokens
(estimated at validation, measured by the model's tokenizer when the shard runs). The whole shard is known up
front, so texts are ordered by length before packing: each call then pads to a similar length, which on this
CPU embeds ~1.6x faster than file order (docs/performance.md)."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from controlplane.fleet.models import CatalogueModel, ModelKind
from controlplane.kinds.base import (
    OUTPUT_LINE_BYTES,
    BodyIssue,
    Call,
    LedgerUnits,
    LineOutput,
    Member,
    ParsedLine,
    TokenCounts,
)
from controlplane.kinds.calls import CallKind

# OpenAI's own limit on inputs per embeddings request.
MAX_EMBEDDING_INPUTS = 2048
# A text's cost in a forward pass beside its characters (~4 a token): [CLS], [SEP] and the pooling of its row.
TEXT_BASE_COST = 8
# One float32 of a vector in the output file: "-0.012345679," at most, as orjson writes it.
FLOAT_JSON_BYTES = 13


@dataclass(frozen=True)
class EmbeddingRequest:
    texts: tuple[str, ...]
    encoding_format: str


def text_units(text: str) -> int:
    """Tokens of one text, estimated: about four characters per word piece, plus the two special tokens.
    Replaced by the tokenizer's count when the shard commits."""
    return len(text) // 4 + 2


class EmbeddingsKind(CallKind):
    url: ClassVar[str] = "/v1/embeddings"
    model_kind: ClassVar[str] = ModelKind.EMBEDDINGS
    counts_tokens: ClassVar[bool] = True

    def parse_body(self, body: dict[str, Any], *, model: CatalogueModel) -> EmbeddingRequest:
        return embedding_request_parse(body, model)

    def work_units(self, request: EmbeddingRequest) -> int:
        return sum(text_units(text) for text in request.texts)

    def quick_units(self, model: CatalogueModel) -> Callable[[dict[str, Any]], int | None]:
        return _EmbeddingQuickLane(model.embedding_dimensions).units

    def pack(
        self, lines: dict[int, ParsedLine], *, max_batch_size: int, min_calls: int, equal_cost: bool
    ) -> list[Call]:
        return pack_embeddings(lines, max_batch_size, min_calls=min_calls, equal_cost=equal_cost)

    def call_pieces(self, call: Call, outputs: dict[str, np.ndarray]) -> list[tuple[Member, Any]]:
        return [(m, {name: array[m.start : m.start + m.rows] for name, array in outputs.items()}) for m in call.members]

    def render(self, parsed: ParsedLine, pieces: dict[int, Any]) -> LineOutput:
        body, tokens = embedding_body(parsed, pieces)
        return LineOutput(body, tokens)

    def output_bytes_estimate(self, *, lines: int, work_units: int, model: CatalogueModel, line_bytes: int = 0) -> int:
        # A vector per line (a line with several inputs has several: counted as one, the estimate stays an
        # estimate), orjson writing each float32 in at most ~12 characters and a comma.
        return lines * (OUTPUT_LINE_BYTES + (model.embedding_dimensions or 0) * FLOAT_JSON_BYTES)

    def ledger_units(
        self, *, completed: int, runnable: int, estimated_work_units: int, measured: TokenCounts
    ) -> LedgerUnits:
        return LedgerUnits(tokens=measured.input, rows=0)


class _EmbeddingQuickLane:
    def __init__(self, dimensions: int | None) -> None:
        self.dimensions = dimensions

    def units(self, body: dict[str, Any]) -> int | None:
        given = body.get("input")
        texts = [given] if type(given) is str else given
        if type(texts) is not list or not 0 < len(texts) <= MAX_EMBEDDING_INPUTS:
            return None
        units = 0
        for text in texts:
            if type(text) is not str or not text:
                return None
            units += len(text) // 4 + 2  # text_units, inlined: once per text of every line
        if body.get("encoding_format", "float") not in ("float", "base64"):
            return None
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != self.dimensions:
            return None
        return units


def embedding_request_parse(body: dict[str, Any], model: CatalogueModel) -> EmbeddingRequest:
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        texts: list[Any] = [raw_input]
    elif isinstance(raw_input, list) and raw_input:
        texts = raw_input
    else:
        raise BodyIssue(
            "invalid_input",
            "body.input must be a non-empty string or a non-empty list of strings.",
            "body.input",
        )
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise BodyIssue(
            "invalid_input",
            f"body.input has {len(texts)} items; the limit is {MAX_EMBEDDING_INPUTS}.",
            "body.input",
        )
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BodyIssue(
                "invalid_input",
                f"body.input[{i}] must be a string (token arrays are not supported), got {type(text).__name__}.",
                "body.input",
            )
        if not text:
            raise BodyIssue("invalid_input", f"body.input[{i}] must not be empty.", "body.input")
    encoding_format = body.get("encoding_format", "float")
    if encoding_format not in ("float", "base64"):
        raise BodyIssue("invalid_value", "body.encoding_format must be 'float' or 'base64'.", "body.encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != model.embedding_dimensions:
        raise BodyIssue(
            "invalid_value",
            f"Model {model.name!r} produces {model.embedding_dimensions} dimensions; "
            "omit body.dimensions or set it to that.",
            "body.dimensions",
        )
    return EmbeddingRequest(texts=tuple(texts), encoding_format=encoding_format)


def pack_embeddings(
    lines: dict[int, ParsedLine], max_batch_size: int, *, min_calls: int = 1, equal_cost: bool = True
) -> list[Call]:
    """Texts in length order, cut into calls of about equal cost, the costliest first.

    ``min_calls``: a small shard is still split into this many calls (the calls kept in flight), so every model
    instance gets a share instead of one instance doing it all while the others idle. Calls hold at most
    ``max_batch_size`` texts. Equal cost, not equal counts: a shard's last third of sorted texts cost up to 5x
    its first (MiniLM executions of 51 texts took 0.04-0.56 s), and a call is the unit the instances share,
    so uneven calls leave one instance idle at a batch's end while the other runs its longest call.
    ``equal_cost`` False (GPU instances: a pass costs its kernel launches, padding is nearly free): every text
    costs the same, so calls hold equal counts and none is spent on a few long texts."""
    items = [
        (len(text), number, slot, text)
        for number, parsed in lines.items()
        for slot, text in enumerate(_embedding(parsed).texts)
    ]
    if not items:
        return []
    items.sort(key=lambda item: (item[0], item[1], item[2]))
    # As few calls as max_batch_size allows (at least min_calls): a pass's fixed cost is paid per call.
    count = max(1, min_calls, math.ceil(len(items) / max(1, max_batch_size)))
    costs = [length + TEXT_BASE_COST if equal_cost else 1 for length, *_ in items]
    ranges = _equal_cost_ranges(costs, count, max(1, max_batch_size))
    calls = []
    # Costliest first (longest processing time first): what is left for the end is short.
    for begin, end in sorted(reversed(ranges), key=lambda run: -sum(costs[run[0] : run[1]])):
        chunk = items[begin:end]
        texts = np.array([[text.encode()] for _, _, _, text in chunk], dtype=np.object_)
        members = [Member(number, slot, i, 1) for i, (_, number, slot, _) in enumerate(chunk)]
        calls.append(Call({"TEXT": texts}, ["EMBEDDING", "TOKENS"], members))
    return calls


def _equal_cost_ranges(costs: list[int], count: int, cap: int) -> list[tuple[int, int]]:
    """``costs`` (in order) cut into ``count`` runs of about equal cost, plus a run wherever ``cap`` items cost
    less than a share (cheap items cut at the cap leave the costly ones ``count`` runs still, not fewer and
    costlier). After each cut the rest is shared evenly again; a run ends where its next item would take it
    past its share by more than half that item."""
    total = sum(costs)
    ranges: list[tuple[int, int]] = []
    begin, spent, done, shared = 0, 0.0, 0.0, 0
    share = total / count
    for i, cost in enumerate(costs):
        at_cap = i - begin >= cap
        if i > begin and (at_cap or spent + cost / 2 > share):
            ranges.append((begin, i))
            shared += not at_cap
            begin, spent = i, 0.0
            share = (total - done) / max(1, count - shared)
        spent += cost
        done += cost
    ranges.append((begin, len(costs)))
    return ranges


def embedding_body(parsed: ParsedLine, pieces: dict[int, dict[str, np.ndarray]]) -> tuple[dict[str, Any], int]:
    """OpenAI's embeddings response for one line; returns it with the line's token count."""
    request = _embedding(parsed)
    data = []
    tokens = 0
    for slot in range(len(request.texts)):
        vector = pieces[slot]["EMBEDDING"][0].astype(np.float32)
        tokens += int(pieces[slot]["TOKENS"].reshape(-1)[0])
        if request.encoding_format == "base64":
            embedding: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode()
        else:
            embedding = vector  # encoded straight from numpy by the part writer (orjson)
        data.append({"object": "embedding", "index": slot, "embedding": embedding})
    body = {
        "object": "list",
        "data": data,
        "model": parsed.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return body, tokens


def _embedding(parsed: ParsedLine) -> EmbeddingRequest:
    assert isinstance(parsed.request, EmbeddingRequest)
    return parsed.request

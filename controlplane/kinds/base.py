"""The endpoint-kind interface: everything a batch endpoint means, in one place.

A batch's pipeline is the same for every endpoint — validate each line, plan shards, run a shard's lines
against Triton, write each line's result, charge the ledger — and asks the batch's kind at four points:

  (a) ``parse_body``: one line's body, for the batch's model → the parsed request (its ``work_units``),
      or a ``BodyIssue`` (param, code, message). The envelope (custom_id, method, url, body.model) is
      the batch pipeline's and the same for every kind (batches/intake/requests.py).
  (b) ``run``: a shard's parsed lines against the backend, each finished line reported to the caller as it
      finishes. Request/response kinds subclass kinds/calls.CallKind, whose ``run`` packs lines into Triton
      calls (``pack``) and keeps several in flight; a kind with streaming or many responses per line
      (generation) implements ``run`` itself.
  (c) ``render``: a line's share of its call's results → its OpenAI-shaped response body and usage.
  (d) ``ledger_units`` / ``measured_work_units``: what a shard's finished lines cost, for the usage ledger
      and the fair-share correction.

Optional fast paths, all "may answer None, then the checked path runs": ``quick_units`` (validation's fast
lane), ``fast_parser`` (re-reading already validated lines at run time), ``columns_collector`` and
``columns_run`` (arrays kept by validation so a shard does not parse JSON again)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import numpy as np

from controlplane.fleet.models import CatalogueModel

if TYPE_CHECKING:
    from controlplane.triton.streaming import GenerationResponse, GenerationStream


class LineIssue(Exception):
    """A line that cannot be run, with the OpenAI-style error code and the field to fix."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


class BodyIssue(LineIssue):
    """A line whose envelope is valid but whose body its kind refuses: as on OpenAI, it is answered in the
    error file with a 400 and the batch runs its other lines. ``param`` always names the field."""

    def __init__(self, code: str, message: str, param: str):
        super().__init__(code, message, param)


class ParsedLine(NamedTuple):
    """A NamedTuple rather than a frozen dataclass: a shard builds one per line, at half the cost."""

    custom_id: str
    model_name: str
    # The kind's parsed request; None for a line run from its shard's columns (its call was packed from
    # them) or for a refused line (``issue``).
    request: Any
    issue: BodyIssue | None = None


class Member(NamedTuple):
    """One piece of one line inside a call: an input text of an embeddings line, or a tensor line's rows
    (``start``..``start+rows`` of the call's batch dimension). One per line of every shard: a NamedTuple."""

    line: int
    slot: int
    start: int
    rows: int


@dataclass
class Call:
    """One Triton request: stacked inputs, the outputs to read, and which lines' pieces it carries."""

    inputs: dict[str, np.ndarray]
    output_names: list[str]
    members: list[Member] = field(default_factory=list)

    def split(self) -> list[Call]:
        """One call per member: used to find which line a rejected call's error belongs to."""
        return [
            Call(
                {name: array[m.start : m.start + m.rows] for name, array in self.inputs.items()},
                self.output_names,
                [Member(m.line, m.slot, 0, m.rows)],
            )
            for m in self.members
        ]


class LineOutput(NamedTuple):
    """A line that got its answer: the OpenAI-shaped response body and the tokens it measured (0 for rows).
    ``tokens`` are input tokens; a generation line also reports its completion, the prompt tokens the engine's
    prefix cache served, and its choices (n), from which the model's expected completion is measured."""

    body: dict[str, Any]
    tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    choices: int = 0


class TokenCounts(NamedTuple):
    """What the model counted for a shard's completed lines (LineOutput's fields, summed)."""

    input: int = 0
    output: int = 0
    cached: int = 0
    choices: int = 0


class LineFailure(NamedTuple):
    """A line answered with an error response (its body refused, or the model rejected it)."""

    status_code: int
    code: str
    message: str
    param: str | None = None

    @classmethod
    def refused(cls, issue: LineIssue) -> LineFailure:
        return cls(400, issue.code, issue.message, issue.param)


LineOutcome = LineOutput | LineFailure


class LedgerUnits(NamedTuple):
    tokens: int  # input tokens
    rows: int
    output_tokens: int = 0
    cached_tokens: int = 0  # of the input tokens, those served from the engine's prefix cache


class Backend(Protocol):
    """Where a shard's calls go (fleet/backend.py implements it: one Triton, or the fleet's routes)."""

    server: str
    # Model instances behind it (None: not known): a shard is split into at most this many calls.
    instances: int | None
    # Its instances run on real GPUs, where a pass costs its kernel launches whatever its texts hold (padding is
    # nearly free): texts are then cut into calls of equal counts, not equal cost (kinds/embeddings.py).
    gpus: bool

    def prepare(self, triton_model: str) -> None: ...

    def infer(
        self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]
    ) -> dict[str, np.ndarray]: ...

    def generation_stream(
        self, triton_model: str, *, on_response: Callable[[GenerationResponse], None]
    ) -> GenerationStream:
        """One generation stream to one server holding the model (a streaming kind's ``run``)."""
        ...


class RunControl(Protocol):
    """What the shard executor gives a kind's ``run``: its stop signal and where finished lines go."""

    def check(self) -> bool:
        """Raises when the shard's lease is lost (publish nothing); True once its batch is stopping, after
        which the run sends nothing new. Cheap: call it as often as convenient."""
        ...

    def finish(self, number: int, outcome: LineOutcome) -> None:
        """Line ``number`` is done (called once per line, from the thread that called ``run``)."""
        ...

    def request_id(self, number: int) -> str:
        """Line ``number``'s output request id, the same on every attempt: a body that carries an id of its
        own (a chat completion's ``chatcmpl-…``) derives it from this, so a regenerated line keeps its id."""
        ...


class ColumnCollector(Protocol):
    """Validation's side of a kind's columns: fed each line of the open shard, ``add`` with the body of a line
    the fast lane accepted, ``add_parsed`` with the checked parse's answer for any other (refused ones too)."""

    written: list[str]

    def add(self, number: int, custom_id: str, body: dict[str, Any]) -> None: ...

    def add_parsed(self, number: int, parsed: ParsedLine) -> None: ...

    def spoil(self) -> None: ...

    def close(self, *, index: int, request_count: int) -> str: ...


# An output line's envelope and body without its payload (id, custom_id, response status and request id, the
# body's object/model/usage fields): ~300 bytes on the embeddings lines of tests/files/test_storage_quota.py.
OUTPUT_LINE_BYTES = 400


class EndpointKind(ABC):
    url: ClassVar[str]  # the batch endpoint, as in the line's "url" and the batch's "endpoint"
    model_kind: ClassVar[str]  # the CatalogueModel.kind that serves it
    # Work units are tokens (the tenant's enqueued-token quota counts them), else rows.
    counts_tokens: ClassVar[bool]

    # --- (a) validation --------------------------------------------------------------------------------

    @abstractmethod
    def parse_body(self, body: dict[str, Any], *, model: CatalogueModel) -> Any:
        """The request a valid body asks for; raises BodyIssue (never anything else) for an invalid one."""

    @abstractmethod
    def work_units(self, request: Any) -> int:
        """What a valid line costs the model (≥ 1), in the unit fair share is charged in."""

    def quota_tokens(self, request: Any) -> int:
        """What a valid line counts against the tenant's enqueued-token quota (kinds that ``counts_tokens``): its
        work units, unless the kind's output can cost more than they estimate (generation: its max_tokens)."""
        return self.work_units(request)

    def quick_units(self, model: CatalogueModel) -> Callable[[dict[str, Any]], int | None] | None:
        """Validation's fast lane for the body: its work units when ``parse_body`` would accept it, else None
        (then the checked parse decides). None: no fast lane for this kind."""
        return None

    def min_shard_lines(self, model: CatalogueModel) -> int:
        """Lines a shard of this kind holds at least, whatever its estimated time (0: no floor of its own). A
        kind whose engine batches a shard's lines itself needs enough of them at once to fill it."""
        return 0

    def fast_parser(self, model: CatalogueModel) -> Callable[[bytes], ParsedLine | None] | None:
        """Re-reading a line validation accepted, without the checks (None for a line it cannot read)."""
        return None

    def columns_collector(
        self, model: CatalogueModel, *, batch_id: str, attempt: int, save: Callable[[str, IO[bytes]], Any]
    ) -> ColumnCollector | None:
        return None

    def columns_run(
        self, *, name: str, first_line: int, last_line: int, request_count: int, model: CatalogueModel
    ) -> tuple[dict[int, ParsedLine], list[Call]] | None:
        """A shard's lines and calls from the columns validation kept (``name``), or None: parse the lines."""
        return None

    # --- (b) + (c) running and rendering --------------------------------------------------------------

    @abstractmethod
    def run(
        self,
        lines: dict[int, ParsedLine],
        *,
        model: CatalogueModel,
        backend: Backend,
        control: RunControl,
        inflight: int,
        calls: list[Call] | None = None,
    ) -> bool:
        """Run a shard's lines; every line is reported to ``control.finish`` unless a stop leaves it out
        (refused lines, ``ParsedLine.issue``, too). ``calls``: already packed (from columns). Returns whether a
        stop was requested. Request/response kinds inherit kinds/calls.CallKind's; a streaming kind writes its
        own."""

    @abstractmethod
    def render(self, parsed: ParsedLine, pieces: dict[int, Any]) -> LineOutput:
        """One line's response body from the pieces of its results (slot → piece): a request/response kind's
        pieces of its calls, a streaming kind's responses."""

    # --- (d) usage ------------------------------------------------------------------------------------

    @abstractmethod
    def ledger_units(
        self, *, completed: int, runnable: int, estimated_work_units: int, measured: TokenCounts
    ) -> LedgerUnits:
        """What a shard's ``completed`` lines are billed: ``runnable`` is its lines less the refused ones,
        ``estimated_work_units`` theirs (from validation), ``measured`` what the model counted."""

    def measured_work_units(self, *, estimated: int, measured: TokenCounts, model: CatalogueModel | None) -> int:
        """A finished shard's work units as measured (fair share is corrected to it at commit); ``model``: the
        entry the batch was validated against, when known."""
        return measured.input if self.counts_tokens and measured.input else estimated

    # --- (e) storage ----------------------------------------------------------------------------------

    def line_output_bytes(self, request: Any) -> int:
        """The expected payload of a valid line's output beyond its envelope, for a kind whose output size varies
        by line more than its work units say (generation: n choices, logprobs); 0 for a kind that estimates per
        batch. Validation sums it over the file (``output_bytes_estimate``'s ``line_bytes``)."""
        return 0

    def output_bytes_estimate(self, *, lines: int, work_units: int, model: CatalogueModel, line_bytes: int = 0) -> int:
        """The expected size of a batch's output file, held against the tenant's storage quota while it runs
        (files/quota.py): a line's envelope, plus a few bytes per work unit for a kind that says no more.
        ``line_bytes``: the sum of ``line_output_bytes`` over the valid lines."""
        return lines * OUTPUT_LINE_BYTES + work_units * 8

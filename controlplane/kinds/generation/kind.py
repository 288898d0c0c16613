"""The generation kinds, ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``: OpenAI's requests
and responses for a catalogue model of kind ``generation``, served by a decoupled Triton model that speaks the vLLM
backend's interface (tinylm on CPU, vLLM on GPUs).

The pieces, each in its own module of this package: the bodies (bodies.py: a body → GenerationRequest or
BodyError, chat template applied here, with the model's own tokenizer), the engine's wire (engine.py), the run
(run.py: one stream, lines in flight, each finished as it ends) and the rendering (render.py). This module binds
them to the endpoint-kind interface (kinds/base.py).

Work units (fair share's charge, the scheduler's shard sizing) are estimated at
validation as (prompt tokens) + w × n × the expected completion, w the model's completion_weight (decode costs
more per token than prefill) and the expected completion per choice the model's measured mean
(``CatalogueModel.expected_completion_tokens``, folded in from every settled shard, scheduling/claims.py),
capped at the line's max_tokens; max_tokens itself until the first shard of the model settled. At commit
the tenant's charge is corrected to what the engine counted: (prompt - cached) + w × completion. The enqueued-token
quota counts more: prompt + n × max_tokens (``quota_tokens``), the most a line can generate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ClassVar

from django.conf import settings

from controlplane.fleet.models import CatalogueModel, ModelKind
from controlplane.kinds.base import (
    OUTPUT_LINE_BYTES,
    Backend,
    BodyIssue,
    Call,
    ColumnCollector,
    EndpointKind,
    LedgerUnits,
    LineOutput,
    ParsedLine,
    RunControl,
    TokenCounts,
)
from controlplane.kinds.generation.bodies import (
    BodyError,
    ChatTokenizer,
    GenerationRequest,
    parse_chat_body,
    parse_completion_body,
)
from controlplane.kinds.generation.columns import GenerationColumnCollector, generation_columns_load
from controlplane.kinds.generation.render import EngineResult, render_completion
from controlplane.kinds.generation.responses import parse_responses_body, responses_param
from controlplane.kinds.generation.responses_render import render_response
from controlplane.kinds.generation.run import inflight_limit, run_generation
from controlplane.kinds.generation.schema import check_schema_compiles
from controlplane.kinds.generation.tokenizer import file_tokenizer
from controlplane.kinds.generation.units import (
    GenerationLine,
    estimated_charge,
    fair_share_charge,
    line_output_bytes,
    line_quota_tokens,
)

__all__ = [
    "ChatCompletionsKind",
    "CompletionsKind",
    "GenerationLine",
    "ResponsesKind",
    "model_tokenizer",
    "tokenizers_preload",
]


class ModelMisconfigured(RuntimeError):
    """A generation model's catalogue entry lacks what parsing needs: every line would fail alike, so the
    batch fails (validation_error) rather than writing an error file of identical lines."""


_tokenizers: dict[Path, ChatTokenizer] = {}  # by resolved directory: one load per directory
# By the catalogue's tokenizer_dir as written: resolving the path (a realpath per call) was ~10% of parsing a
# line, which validation does for every line.
_tokenizers_by_setting: dict[str, ChatTokenizer] = {}
_tokenizers_lock = threading.Lock()


def tokenizer_path(model: CatalogueModel) -> Path:
    if not model.tokenizer_dir:
        raise ModelMisconfigured(f"catalogue model {model.name!r} has no tokenizer_dir")
    path = Path(model.tokenizer_dir)
    return path if path.is_absolute() else Path(settings.BASE_DIR) / path


def model_tokenizer(model: CatalogueModel) -> ChatTokenizer:
    """The model's Hugging Face tokenizer (with its chat_template), loaded once per process per directory: read
    from its files where that gives what transformers gives (kinds/generation/tokenizer.py), else transformers'
    AutoTokenizer. Offline: the directory is the model's own, never a hub name."""
    tokenizer = _tokenizers_by_setting.get(model.tokenizer_dir)
    if tokenizer is not None:
        return tokenizer
    path = tokenizer_path(model).resolve()
    tokenizer = _tokenizers.get(path)
    if tokenizer is None:
        with _tokenizers_lock:
            tokenizer = _tokenizers.get(path)
            if tokenizer is None:
                if not (path / "tokenizer_config.json").is_file():
                    raise ModelMisconfigured(
                        f"catalogue model {model.name!r}: no tokenizer at {path} (for the shipped tinylm, "
                        "`make install` trains and writes it)"
                    )
                tokenizer = _tokenizers[path] = file_tokenizer(path) or _auto_tokenizer(path)
    _tokenizers_by_setting[model.tokenizer_dir] = tokenizer
    return tokenizer


def _auto_tokenizer(path: Path) -> ChatTokenizer:
    """transformers' own loader, for a directory file_tokenizer does not read exactly (it imports torch: ~3.6 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)  # type: ignore[no-any-return]


def tokenizers_preload() -> list[str]:
    """Load the enabled generation models' tokenizers into this process (model_tokenizer's cache), so its first
    generation shard or validation does not pay for importing transformers; returns the models loaded. A model
    whose tokenizer cannot load is skipped here: its lines report that when they are parsed."""
    loaded = []
    enabled = CatalogueModel.objects.filter(kind=ModelKind.GENERATION, is_enabled=True)
    for model in enabled.exclude(tokenizer_dir=""):
        try:
            model_tokenizer(model)
        except (ModelMisconfigured, OSError, ValueError):
            continue
        loaded.append(model.name)
    return loaded


def _context_length(model: CatalogueModel) -> int:
    if not model.context_length:
        raise ModelMisconfigured(f"catalogue model {model.name!r} has no context_length")
    return model.context_length


def _body_param(param: str | None) -> str:
    """The parser names fields as OpenAI does (``messages[2].role``); a batch line's error names the field in
    the line, under ``body`` (as every kind's BodyIssue does)."""
    return f"body.{param}" if param else "body"


class _GenerationKind(EndpointKind):
    model_kind: ClassVar[str] = ModelKind.GENERATION
    counts_tokens: ClassVar[bool] = True
    parse: ClassVar[Callable[..., GenerationRequest]]

    def parse_body(self, body: dict[str, Any], *, model: CatalogueModel) -> GenerationLine:
        try:
            request = type(self).parse(
                body,
                tokenizer=model_tokenizer(model),
                context_length=_context_length(model),
                max_output_units=settings.GENERATION_MAX_LINE_OUTPUT_UNITS,
            )
        except BodyError as error:
            raise BodyIssue(error.code, error.message, _body_param(error.param)) from None
        if request.response_format.type != "text":
            if not model.structured_outputs:
                # Accepted by the parser (it is OpenAI's), but this model's engine does not constrain decoding:
                # refused rather than answered with text that ignores the format.
                raise BodyIssue(
                    "unsupported_value",
                    f"response_format {request.response_format.type!r} is not supported for model {model.name!r} "
                    "(no constrained decoding); use 'text'.",
                    "body.response_format",
                )
            try:
                check_schema_compiles(request.response_format)
            except BodyError as error:
                raise BodyIssue(error.code, error.message, _body_param(error.param)) from None
        if request.tool_choice.forced and not model.structured_outputs:
            # A forced call is decoded under the call's grammar (tools.py): without it the answer may be no call.
            raise BodyIssue(
                "unsupported_value",
                f"tool_choice {request.tool_choice.mode!r} is not supported for model {model.name!r} (no constrained "
                "decoding); use 'auto'.",
                "body.tool_choice",
            )
        units = estimated_charge(
            request,
            completion_weight=model.completion_weight,
            expected_completion_tokens=model.expected_completion_tokens,
        )
        output_bytes = line_output_bytes(request, expected_completion_tokens=model.expected_completion_tokens)
        return GenerationLine(request, max(1, round(units)), output_bytes)

    def work_units(self, request: GenerationLine) -> int:
        return request.units

    def line_output_bytes(self, request: GenerationLine) -> int:
        return request.output_bytes

    def output_bytes_estimate(self, *, lines: int, work_units: int, model: CatalogueModel, line_bytes: int = 0) -> int:
        # Per line (n, max_tokens, logprobs), not per work unit: the units count the prompt, the output does not.
        return lines * OUTPUT_LINE_BYTES + line_bytes

    def quota_tokens(self, request: GenerationLine) -> int:
        # Not the estimate: an expected completion far below max_tokens would leave the output unbounded.
        return line_quota_tokens(request.request)

    def min_shard_lines(self, model: CatalogueModel) -> int:
        # A slot runs one shard at a time and the engine batches only what is in flight: shards cut at 1 s of
        # estimated time held ~16 tinylm lines, so 2 slots gave the engine <= 32 of its 64 sequences, idle
        # between shards (docs/performance.md). A shard of the in-flight bound fills it alone.
        return inflight_limit(model)

    def columns_collector(
        self, model: CatalogueModel, *, batch_id: str, attempt: int, save: Callable[[str, IO[bytes]], Any]
    ) -> ColumnCollector | None:
        return GenerationColumnCollector(model, batch_id=batch_id, attempt=attempt, save=save)

    def columns_run(
        self, *, name: str, first_line: int, last_line: int, request_count: int, model: CatalogueModel
    ) -> tuple[dict[int, ParsedLine], list[Call]] | None:
        # The lines as validation parsed them (template applied, prompt tokenized): no calls, lines stream.
        lines = generation_columns_load(
            name=name, first_line=first_line, last_line=last_line, request_count=request_count, model=model
        )
        return None if lines is None else (lines, [])

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
        # ``inflight`` counts calls of request/response kinds; generation bounds lines by the model's
        # max_num_seqs instead (run.py).
        return run_generation(
            lines, model=model, backend=backend, control=control, render=self.render, request_of=_request
        )

    def render(self, parsed: ParsedLine, pieces: dict[int, Any]) -> LineOutput:
        """``pieces[0]``: the line's (EngineResult, output request id), from run.py."""
        result, request_id = pieces[0]
        assert isinstance(result, EngineResult)
        body = self.render_body(_request(parsed), result, request_id=request_id)
        return LineOutput(
            body,
            result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
            choices=len(result.choices),
        )

    def render_body(self, request: GenerationRequest, result: EngineResult, *, request_id: str) -> dict[str, Any]:
        return render_completion(request, result, request_id=request_id, created=int(time.time()))

    def ledger_units(
        self, *, completed: int, runnable: int, estimated_work_units: int, measured: TokenCounts
    ) -> LedgerUnits:
        # What the engine counted for the completed lines (failed, refused and stopped lines are not billed).
        return LedgerUnits(tokens=measured.input, rows=0, output_tokens=measured.output, cached_tokens=measured.cached)

    def measured_work_units(self, *, estimated: int, measured: TokenCounts, model: CatalogueModel | None) -> int:
        if not measured.input:
            return estimated  # nothing completed (a stopped shard): the estimate stands
        weight = model.completion_weight if model is not None else 1.0
        charge = fair_share_charge(
            prompt_tokens=measured.input,
            cached_tokens=min(measured.cached, measured.input),
            completion_tokens=measured.output,
            completion_weight=weight,
        )
        return max(1, round(charge))


def _request(parsed: ParsedLine) -> GenerationRequest:
    assert isinstance(parsed.request, GenerationLine)
    return parsed.request.request


class ChatCompletionsKind(_GenerationKind):
    url: ClassVar[str] = "/v1/chat/completions"
    parse = staticmethod(parse_chat_body)


class CompletionsKind(_GenerationKind):
    url: ClassVar[str] = "/v1/completions"
    parse = staticmethod(parse_completion_body)


class ResponsesKind(_GenerationKind):
    """OpenAI's Responses API (responses.py and responses_input.py parse, responses_render.py renders). Its lines'
    shard columns keep the echo a response repeats (ResponsesRequest.echo) beside the request."""

    url: ClassVar[str] = "/v1/responses"
    parse = staticmethod(parse_responses_body)

    def parse_body(self, body: dict[str, Any], *, model: CatalogueModel) -> GenerationLine:
        try:
            return super().parse_body(body, model=model)
        except BodyIssue as issue:
            # The structured-output checks name chat's field (body.response_format...); the line sent text.format.
            chat_param = issue.param or ""
            if not chat_param.startswith("body.response_format"):
                raise
            param = responses_param(chat_param.removeprefix("body."))
            message = issue.message.replace("response_format", "text.format")
            raise BodyIssue(issue.code, message, f"body.{param}") from None

    def render_body(self, request: GenerationRequest, result: EngineResult, *, request_id: str) -> dict[str, Any]:
        return render_response(request, result, request_id=request_id, created=int(time.time()))

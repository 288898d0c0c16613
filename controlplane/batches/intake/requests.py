"""Parsing one input line into a typed request. The envelope (custom_id, method, url, body.model) is checked
here, the same for every endpoint; the body by the batch's endpoint kind (kinds/registry.py). Shared by
validation (whole file, before any work) and dispatch (one shard), so both agree on what a line means."""

from __future__ import annotations

from controlplane.batches.intake.lines import load_json_line
from controlplane.core.http.errors import quote
from controlplane.fleet.models import ADAPTER_SEPARATOR, CatalogueModel, split_model_name
from controlplane.fleet.selectors import catalogue_adapter_get, catalogue_adapter_names
from controlplane.kinds.base import BodyIssue, LineIssue, ParsedLine
from controlplane.kinds.registry import kind_for

__all__ = ["LineIssue", "ModelResolver", "ParsedLine", "line_output_bytes", "parse_line", "quota_tokens", "work_units"]


def work_units(parsed: ParsedLine, *, endpoint: str) -> int:
    """What a line costs the model, in the unit fair share is charged in (the kind's: tokens or rows); a
    refused line costs nothing, it never reaches the model."""
    if parsed.issue is not None:
        return 0
    return kind_for(endpoint).work_units(parsed.request)


def quota_tokens(parsed: ParsedLine, *, endpoint: str) -> int:
    """What a line counts against the enqueued-token quota (kinds/base.EndpointKind.quota_tokens); a refused line
    nothing."""
    if parsed.issue is not None:
        return 0
    return kind_for(endpoint).quota_tokens(parsed.request)


def line_output_bytes(parsed: ParsedLine, *, endpoint: str) -> int:
    """The expected output of a line beyond its envelope (kinds/base.EndpointKind.line_output_bytes); a refused
    line's is its error body, in the envelope."""
    if parsed.issue is not None:
        return 0
    return kind_for(endpoint).line_output_bytes(parsed.request)


class ModelResolver:
    """Looks catalogue models up once per name for the life of one validation or shard run. A shard
    run passes its batch's pinned entry (batches/pinning.py), which answers for its name whatever the
    catalogue says now."""

    def __init__(self, pinned: CatalogueModel | None = None) -> None:
        self._cache: dict[str, CatalogueModel | None] = {} if pinned is None else {pinned.name: pinned}
        self._adapters: dict[tuple[int, str], bool] = {}

    def get(self, name: str) -> CatalogueModel | None:
        if name not in self._cache:
            # Postgres cannot hold a NUL in text, so no model has one (and the query itself would fail).
            found = None if "\x00" in name else CatalogueModel.objects.filter(name=name, is_enabled=True).first()
            self._cache[name] = found
        return self._cache[name]

    def adapter_issue(self, model: CatalogueModel, model_name: str) -> BodyIssue | None:
        """For a line naming a LoRA adapter (``base:adapter``, resolved to ``model``): None when the base serves
        it, else the 400 the line gets (the batch runs on: an adapter disabled or mistyped fails its lines only)."""
        if ADAPTER_SEPARATOR not in model_name:
            return None
        _, adapter = split_model_name(model_name)
        key = (model.id, adapter)
        if key not in self._adapters:
            self._adapters[key] = catalogue_adapter_get(base=model, name=adapter) is not None
        if self._adapters[key]:
            return None
        known = catalogue_adapter_names(base=model)
        return BodyIssue(
            "model_not_found",
            f"The model {quote(model_name)} does not exist: {model.name!r} has no adapter {adapter!r} "
            f"({'its adapters: ' + ', '.join(known) if known else 'it serves no adapters'}).",
            "body.model",
        )


def parse_line(raw: bytes, *, endpoint: str, resolver: ModelResolver) -> ParsedLine:
    """The line's request, or (valid envelope, refused body) a ParsedLine carrying its ``issue``. Raises
    LineIssue for an envelope problem, which fails the batch at validation: not JSON, no custom_id, method or
    url, a url other than the batch's endpoint, no body object, a model that is unknown or not of this
    endpoint's kind (a batch is one model, as on OpenAI: a wrong model would fail every line)."""
    obj = load_json_line(raw)
    if not isinstance(obj, dict):
        raise LineIssue("invalid_request", "Each line must be a JSON object.")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineIssue("missing_custom_id", "Each line needs a non-empty string 'custom_id'.", "custom_id")
    if len(custom_id) > 512:
        raise LineIssue("invalid_custom_id", "custom_id must be at most 512 characters.", "custom_id")
    if obj.get("method") != "POST":
        raise LineIssue("invalid_method", f"method must be 'POST', got {quote(obj.get('method'))}.", "method")
    if obj.get("url") != endpoint:
        raise LineIssue(
            "mismatched_url",
            f"url must be the batch's endpoint {endpoint!r}, got {quote(obj.get('url'))}.",
            "url",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineIssue("invalid_body", "body must be a JSON object.", "body")
    model_name = body.get("model")
    if not isinstance(model_name, str) or not model_name:
        raise LineIssue("missing_model", "body.model must name a model.", "body.model")
    # `base:adapter` names a LoRA adapter of a catalogue model: the line runs on the base (fleet/models.py).
    model = resolver.get(split_model_name(model_name)[0])
    if model is None:
        raise LineIssue("model_not_found", f"The model {quote(model_name)} does not exist.", "body.model")
    kind = kind_for(endpoint)
    if model.kind != kind.model_kind:
        raise LineIssue(
            "invalid_model",
            f"Model {model_name!r} serves {model.get_kind_display()}, not {endpoint}.",
            "body.model",
        )
    adapter_issue = resolver.adapter_issue(model, model_name)
    if adapter_issue is not None:
        return ParsedLine(custom_id, model_name, None, adapter_issue)
    try:
        request = kind.parse_body(body, model=model)
    except BodyIssue as issue:
        # The envelope is valid: the line is answered with a 400 and the batch runs on (OpenAI's semantics).
        return ParsedLine(custom_id, model_name, None, issue)
    return ParsedLine(custom_id, model_name, request)

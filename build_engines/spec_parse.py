"""Section-by-section validation of a parsed TOML spec into ModelSpec.

Problems are collected, not raised one at a time, and each is keyed by its dotted field path
(`profile.max.batch`, `inputs[1].dtype`) so the error says exactly what to edit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from build_engines.errors import SpecError
from build_engines.spec import (
    DEFAULT_OPSET,
    DTYPES,
    PRECISIONS,
    PROFILE_LEVELS,
    VALUE_KINDS,
    Dim,
    DynamicBatching,
    InputSpec,
    ModelSpec,
    OutputSpec,
    TextSpec,
    Tolerance,
    TritonSpec,
)


def parse_spec(data: dict[str, Any], spec_path: Path, sha256: str) -> ModelSpec:
    reader = _Reader()
    spec = _parse(data, reader, spec_path, sha256)
    if reader.problems or spec is None:
        raise SpecError(spec_path, reader.problems)
    return spec


class _Reader:
    """Pulls typed fields out of TOML tables, recording (field, message) instead of raising."""

    _MISSING = object()

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def fail(self, field: str, message: str) -> None:
        self.problems.append((field, message))

    def get(
        self, table: dict[str, Any], key: str, field: str, kind: type | tuple[type, ...], default: Any = _MISSING
    ) -> Any:
        if key not in table:
            if default is self._MISSING:
                self.fail(field, "is required")
            return None if default is self._MISSING else default
        value = table[key]
        # bool is an int subclass in Python; a spec saying `max_batch_size = true` is a typo, not 1.
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.fail(field, f"must be {_kind_name(kinds)}, got {value!r}")
            return None
        if float in kinds and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kinds):
            self.fail(field, f"must be {_kind_name(kinds)}, got {value!r}")
            return None
        return value

    def table(self, parent: dict[str, Any], key: str, field: str, required: bool = True) -> dict[str, Any]:
        value = self.get(parent, key, field, dict, default=self._MISSING if required else {})
        return value if isinstance(value, dict) else {}

    def no_extra(self, table: dict[str, Any], allowed: set[str], prefix: str) -> None:
        for key in sorted(set(table) - allowed):
            self.fail(f"{prefix}{key}", f"unknown field (allowed: {', '.join(sorted(allowed))})")

    def reference(self, table: dict[str, Any], key: str, field: str) -> str | None:
        value = self.get(table, key, field, str)
        if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
            self.fail(field, f"must look like 'package.module:function', got {value!r}")
            return None
        return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "a table",
        bool: "true or false",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


_TOP_FIELDS = {
    "name",
    "source",
    "opset",
    "precisions",
    "inputs",
    "outputs",
    "profile",
    "tolerance",
    "triton",
    "text",
    "trt",
}


def _parse(data: dict[str, Any], r: _Reader, spec_path: Path, sha: str) -> ModelSpec | None:
    r.no_extra(data, _TOP_FIELDS, "")
    name = r.get(data, "name", "name", str)
    if name is not None and not (name.isascii() and name.replace("_", "").replace("-", "").isalnum()):
        r.fail("name", f"must be letters, digits, '_' or '-' (it names Triton model folders), got {name!r}")
    source = r.reference(data, "source", "source")
    opset = r.get(data, "opset", "opset", int, default=DEFAULT_OPSET)
    if opset is not None and not 9 <= opset <= 21:
        r.fail("opset", f"must be between 9 and 21, got {opset}")
    precisions = _parse_precisions(data, r)
    inputs = tuple(_parse_tensors(data, r, "inputs", is_input=True))
    outputs = tuple(_parse_tensors(data, r, "outputs", is_input=False))
    axes = {dim for tensor in inputs for dim in tensor.shape if isinstance(dim, str)}
    profile = _parse_profile(data, r, axes)
    tolerance = _parse_tolerance(data, r, precisions)
    triton = _parse_triton(data, r, precisions)
    text = _parse_text(data, r, spec_path)
    trt = r.table(data, "trt", "trt", required=False)
    r.no_extra(trt, {"workspace_mib"}, "trt.")
    workspace_mib = r.get(trt, "workspace_mib", "trt.workspace_mib", int, default=2048)
    if r.problems:
        return None
    assert source is not None  # r.reference records a problem whenever it returns None
    spec = ModelSpec(
        path=spec_path,
        sha256=sha,
        name=name,
        source=source,
        opset=opset,
        precisions=precisions,
        inputs=inputs,
        outputs=outputs,
        profile=profile,
        tolerance=tolerance,
        triton=triton,
        text=text,
        workspace_mib=workspace_mib,
    )
    _cross_check(spec, r)
    return None if r.problems else spec


def _parse_precisions(data: dict[str, Any], r: _Reader) -> tuple[str, ...]:
    values = r.get(data, "precisions", "precisions", list, default=["fp32"]) or []
    for i, value in enumerate(values):
        if value not in PRECISIONS:
            r.fail(f"precisions[{i}]", f"must be one of {', '.join(PRECISIONS)}, got {value!r}")
    if not values:
        r.fail("precisions", "must list at least one precision")
    return tuple(v for v in values if v in PRECISIONS)


def _parse_shape(value: Any, field: str, r: _Reader) -> tuple[Dim, ...]:
    if not isinstance(value, list) or not value:
        r.fail(field, f"must be a non-empty list of sizes (int) and axis names (str), got {value!r}")
        return ()
    for i, dim in enumerate(value):
        if isinstance(dim, bool) or not isinstance(dim, (int, str)) or (isinstance(dim, int) and dim < 1):
            r.fail(f"{field}[{i}]", f"must be a positive int or a dynamic axis name, got {dim!r}")
    return tuple(value)


def _parse_tensors(data: dict[str, Any], r: _Reader, key: str, *, is_input: bool) -> list[Any]:
    items = r.get(data, key, key, list) or []
    if not items and key in data:
        r.fail(key, "must list at least one tensor")
    tensors: list[Any] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        prefix = f"{key}[{i}]"
        if not isinstance(item, dict):
            r.fail(prefix, "must be a table ([[inputs]] / [[outputs]])")
            continue
        allowed = {"name", "dtype", "shape"} | ({"values", "low", "high"} if is_input else set())
        r.no_extra(item, allowed, f"{prefix}.")
        name = r.get(item, "name", f"{prefix}.name", str)
        if name in seen:
            r.fail(f"{prefix}.name", f"duplicate tensor name {name!r}")
        seen.add(name)
        dtype = r.get(item, "dtype", f"{prefix}.dtype", str)
        if dtype is not None and dtype not in DTYPES:
            r.fail(f"{prefix}.dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
        shape = _parse_shape(item.get("shape"), f"{prefix}.shape", r) if "shape" in item else ()
        if "shape" not in item:
            r.fail(f"{prefix}.shape", "is required")
        if not is_input:
            tensors.append(OutputSpec(name=name, dtype=dtype, shape=shape))
            continue
        values = r.get(item, "values", f"{prefix}.values", str, default="uniform")
        if values not in VALUE_KINDS:
            r.fail(f"{prefix}.values", f"must be one of {', '.join(VALUE_KINDS)}, got {values!r}")
        is_int = dtype in ("int32", "int64")
        needs_range = values == "uniform" and is_int
        low = r.get(item, "low", f"{prefix}.low", float, default=_Reader._MISSING if needs_range else -1.0)
        high = r.get(item, "high", f"{prefix}.high", float, default=_Reader._MISSING if needs_range else 1.0)
        if low is not None and high is not None and low >= high:
            r.fail(f"{prefix}.high", f"must be greater than low ({low}), got {high}")
        tensors.append(InputSpec(name=name, dtype=dtype, shape=shape, values=values, low=low, high=high))
    return tensors


def _parse_profile(data: dict[str, Any], r: _Reader, axes: set[str]) -> dict[str, dict[str, int]]:
    # A model without dynamic axes has a single shape, so it needs no profile at all.
    table = r.table(data, "profile", "profile", required=bool(axes))
    r.no_extra(table, set(PROFILE_LEVELS), "profile.")
    profile: dict[str, dict[str, int]] = {}
    for level in PROFILE_LEVELS:
        sizes = r.table(table, level, f"profile.{level}", required=bool(axes)) if table else {}
        for axis in sorted(set(sizes) - axes):
            r.fail(f"profile.{level}.{axis}", "no input has a dynamic axis with this name")
        profile[level] = {}
        for axis in sorted(axes):
            size = r.get(sizes, axis, f"profile.{level}.{axis}", int) if table else None
            if size is not None and size < 1:
                r.fail(f"profile.{level}.{axis}", f"must be at least 1, got {size}")
            elif size is not None:
                profile[level][axis] = size
    for axis in sorted(axes):
        lo, mid, hi = (profile[level].get(axis) for level in PROFILE_LEVELS)
        if None not in (lo, mid, hi) and not lo <= mid <= hi:  # type: ignore[operator]
            r.fail(f"profile.opt.{axis}", f"needs min <= opt <= max, got {lo} <= {mid} <= {hi}")
    return profile


def _parse_tolerance(data: dict[str, Any], r: _Reader, precisions: tuple[str, ...]) -> dict[str, Tolerance]:
    table = r.table(data, "tolerance", "tolerance")
    r.no_extra(table, set(PRECISIONS), "tolerance.")
    result: dict[str, Tolerance] = {}
    for precision in precisions:
        if table and precision not in table:
            r.fail(f"tolerance.{precision}", f"is required because precisions lists {precision!r}")
            continue
        entry = r.table(table, precision, f"tolerance.{precision}") if table else {}
        r.no_extra(entry, {"max_abs", "min_cosine", "max_rel"}, f"tolerance.{precision}.")
        max_abs = r.get(entry, "max_abs", f"tolerance.{precision}.max_abs", float)
        min_cosine = r.get(entry, "min_cosine", f"tolerance.{precision}.min_cosine", float)
        max_rel = r.get(entry, "max_rel", f"tolerance.{precision}.max_rel", float, default=None)
        if max_abs is not None and max_abs < 0:
            r.fail(f"tolerance.{precision}.max_abs", f"must be >= 0, got {max_abs}")
        if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
            r.fail(f"tolerance.{precision}.min_cosine", f"must be within [-1, 1], got {min_cosine}")
        if None not in (max_abs, min_cosine):
            result[precision] = Tolerance(max_abs=max_abs, min_cosine=min_cosine, max_rel=max_rel)
    return result


def _parse_triton(data: dict[str, Any], r: _Reader, precisions: tuple[str, ...]) -> TritonSpec:
    table = r.table(data, "triton", "triton")
    r.no_extra(
        table,
        {"max_batch_size", "instance_count", "trt_precision", "compute_capabilities", "dynamic_batching"},
        "triton.",
    )
    max_batch = r.get(table, "max_batch_size", "triton.max_batch_size", int) if table else 0
    if max_batch is not None and max_batch < 0:
        r.fail("triton.max_batch_size", f"must be >= 0 (0 disables batching), got {max_batch}")
    count = r.get(table, "instance_count", "triton.instance_count", int, default=1)
    if count is not None and count < 1:
        r.fail("triton.instance_count", f"must be at least 1, got {count}")
    default_precision = precisions[-1] if precisions else "fp32"
    trt_precision = r.get(table, "trt_precision", "triton.trt_precision", str, default=default_precision)
    if trt_precision is not None and trt_precision not in precisions:
        r.fail("triton.trt_precision", f"must be one of precisions ({', '.join(precisions)}), got {trt_precision!r}")
    ccs = r.get(table, "compute_capabilities", "triton.compute_capabilities", list, default=[]) or []
    for i, cc in enumerate(ccs):
        major, _, minor = str(cc).partition(".")
        if not (isinstance(cc, str) and major.isdigit() and minor.isdigit()):
            r.fail(f"triton.compute_capabilities[{i}]", f'must look like "8.6", got {cc!r}')
    batching = None
    if "dynamic_batching" in table:
        db = r.table(table, "dynamic_batching", "triton.dynamic_batching")
        r.no_extra(db, {"preferred_batch_size", "max_queue_delay_microseconds"}, "triton.dynamic_batching.")
        preferred = (
            r.get(db, "preferred_batch_size", "triton.dynamic_batching.preferred_batch_size", list, default=[]) or []
        )
        for i, size in enumerate(preferred):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                r.fail(f"triton.dynamic_batching.preferred_batch_size[{i}]", f"must be a positive int, got {size!r}")
            elif max_batch and size > max_batch:
                r.fail(
                    f"triton.dynamic_batching.preferred_batch_size[{i}]",
                    f"{size} is above triton.max_batch_size ({max_batch})",
                )
        delay = r.get(
            db, "max_queue_delay_microseconds", "triton.dynamic_batching.max_queue_delay_microseconds", int, default=0
        )
        if delay is not None and delay < 0:
            r.fail("triton.dynamic_batching.max_queue_delay_microseconds", f"must be >= 0, got {delay}")
        batching = DynamicBatching(tuple(p for p in preferred if isinstance(p, int)), delay or 0)
    return TritonSpec(
        max_batch_size=max_batch or 0,
        instance_count=count or 1,
        trt_precision=trt_precision or "fp32",
        compute_capabilities=tuple(str(cc) for cc in ccs),
        dynamic_batching=batching,
    )


def _parse_text(data: dict[str, Any], r: _Reader, spec_path: Path) -> TextSpec | None:
    if "text" not in data:
        return None
    table = r.table(data, "text", "text")
    r.no_extra(table, {"tokenizer", "model_dir", "max_length", "corpus"}, "text.")
    tokenizer = r.reference(table, "tokenizer", "text.tokenizer")
    model_dir = r.reference(table, "model_dir", "text.model_dir")
    max_length = r.get(table, "max_length", "text.max_length", int)
    if max_length is not None and max_length < 2:
        r.fail("text.max_length", f"must be at least 2 (room for [CLS] and [SEP]), got {max_length}")
    corpus_name = r.get(table, "corpus", "text.corpus", str)
    corpus = (spec_path.parent / corpus_name).resolve() if corpus_name else spec_path
    if corpus_name and not corpus.is_file():
        r.fail("text.corpus", f"no file at {corpus} (paths are relative to the spec file)")
    return TextSpec(tokenizer=tokenizer or "", model_dir=model_dir or "", max_length=max_length or 0, corpus=corpus)


def _cross_check(spec: ModelSpec, r: _Reader) -> None:
    """Checks that span sections: they can only run once each section parsed cleanly."""
    if spec.triton.max_batch_size > 0:
        # Triton's batch dimension is implicit and always the first axis of every input and output.
        sections: tuple[tuple[str, tuple[InputSpec | OutputSpec, ...]], ...] = (
            ("inputs", spec.inputs),
            ("outputs", spec.outputs),
        )
        for key, tensors in sections:
            for i, tensor in enumerate(tensors):
                if tensor.shape[0] != spec.inputs[0].shape[0] or not isinstance(tensor.shape[0], str):
                    r.fail(
                        f"{key}[{i}].shape[0]",
                        "must be the shared dynamic batch axis (the same name in every "
                        "tensor) because triton.max_batch_size > 0",
                    )
        batch_axis = spec.inputs[0].shape[0]
        batch_max = spec.profile["max"].get(batch_axis) if isinstance(batch_axis, str) else None
        if batch_max is not None and batch_max < spec.triton.max_batch_size:
            r.fail(
                f"profile.max.{batch_axis}",
                f"{batch_max} is below triton.max_batch_size "
                f"({spec.triton.max_batch_size}); TensorRT could not run a full batch",
            )
    if spec.text is not None:
        names = [t.name for t in spec.inputs]
        if names[:2] != ["input_ids", "attention_mask"] or len(names) > 3:
            r.fail(
                "inputs",
                "a [text] model takes input_ids, attention_mask (and optionally token_type_ids), "
                f"in that order; got {names}",
            )
        seq_axis = spec.inputs[0].shape[-1]
        if isinstance(seq_axis, str) and spec.text.max_length > spec.profile["max"].get(seq_axis, 0):
            r.fail(
                "text.max_length",
                f"{spec.text.max_length} is above profile.max.{seq_axis} "
                f"({spec.profile['max'].get(seq_axis)}); tokenised text would not fit",
            )

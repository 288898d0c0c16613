"""A served shape read from, and written into, a config.pbtxt: the tuned fields only, comments kept.

`rewrite` edits the text rather than re-printing the protobuf, so the comments that say why a field has its
value survive; the result is parsed back and must read as the shape asked for, or nothing is written. The
same rewrite makes every candidate's config in the scratch repository and the served one with --write.
"""

from __future__ import annotations

import re
from typing import Any

from build_engines.errors import BuildEnginesError, SpecError
from build_engines.tune_search import Shape

THREADS_KEY = "INTRA_OP_THREADS"


class ConfigRewriteError(BuildEnginesError):
    """The config's text has a form the rewrite does not know: it is left as it was."""

    exit_code = 2


def parse(text: str, path: object = "config.pbtxt") -> Any:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise SpecError(path, [("config.pbtxt", str(exc))]) from exc


def shape_of(config: Any) -> Shape:
    batching = config.dynamic_batching if config.HasField("dynamic_batching") else None
    threads = config.parameters[THREADS_KEY].string_value if THREADS_KEY in config.parameters else None
    groups = list(config.instance_group)
    return Shape(
        max_batch_size=int(config.max_batch_size),
        delay_us=int(batching.max_queue_delay_microseconds) if batching is not None else None,
        preferred=tuple(sorted(int(p) for p in batching.preferred_batch_size)) if batching is not None else (),
        instances=sum(int(g.count) or 1 for g in groups) if groups else 1,
        threads=int(threads) if threads is not None and threads.strip().isdigit() else None,
    )


def _block(text: str, keyword: str) -> tuple[int, int] | None:
    """(start of the body, index of the closing brace) of the first ``keyword [{|[]`` block, comments and
    strings skipped when counting brackets."""
    match = re.search(rf"^[ \t]*{keyword}\s*:?\s*([{{\[])", text, re.MULTILINE)
    if match is None:
        return None
    depth, i = 0, match.start(1)
    while i < len(text):
        char = text[i]
        if char == "#":
            i = text.find("\n", i)
            if i < 0:
                break
        elif char == '"':
            i = text.find('"', i + 1)
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return match.end(1), i
        i += 1
    raise ConfigRewriteError(f"unbalanced `{keyword}` block")


def _set_scalar(body: str, key: str, value: int, indent: str) -> str:
    pattern = re.compile(rf"^([ \t]*{key}\s*:\s*)\d+", re.MULTILINE)
    if pattern.search(body):
        return pattern.sub(lambda m: f"{m.group(1)}{value}", body, count=1)
    return f"\n{indent}{key}: {value}" + body


def rewrite(text: str, shape: Shape) -> str:
    """``text`` with max_batch_size, dynamic_batching, the instance count and INTRA_OP_THREADS set to ``shape``."""
    current = shape_of(parse(text))
    out = re.sub(r"^([ \t]*max_batch_size\s*:\s*)\d+", rf"\g<1>{shape.max_batch_size}", text, count=1, flags=re.M)
    out = _rewrite_batching(out, shape)
    if shape.instances != current.instances:
        span = _block(out, "instance_group")
        if span is None:
            out = (
                out.rstrip("\n")
                + f"\ninstance_group [\n  {{\n    kind: KIND_CPU\n    count: {shape.instances}\n  }}\n]\n"
            )
        else:
            start, end = span
            if out[start - 1] == "[":  # `instance_group [ { ... } ]`: the count goes inside the first group
                start = out.index("{", start) + 1
            out = out[:start] + _set_scalar(out[start:end], "count", shape.instances, "    ") + out[end:]
    if shape.threads is not None and shape.threads != current.threads:
        out = set_parameter(out, THREADS_KEY, str(shape.threads))
    written = shape_of(parse(out))
    if written != shape:
        raise ConfigRewriteError(f"the rewritten config reads as {written.describe()}, not {shape.describe()}")
    return out


def set_parameter(text: str, key: str, value: str) -> str:
    """``text`` with the string_value of the parameter ``key`` set to ``value``; its comments stay."""
    found_key = re.search(rf'key\s*:\s*"{re.escape(key)}"', text)
    found = re.compile(r'(string_value\s*:\s*")[^"]*(")').search(text, found_key.end()) if found_key else None
    if found is None:
        raise ConfigRewriteError(f"no {key} string_value to set")
    return text[: found.start()] + f"{found.group(1)}{value}{found.group(2)}" + text[found.end() :]


def _rewrite_batching(text: str, shape: Shape) -> str:
    span = _block(text, "dynamic_batching")
    if shape.delay_us is None:
        if span is not None:
            start = text.rfind("dynamic_batching", 0, span[0])
            text = text[:start] + text[span[1] + 1 :].lstrip("\n")
        return text
    if span is None:
        preferred = "".join(f"\n  preferred_batch_size: {p}" for p in shape.preferred)
        block = f"dynamic_batching {{{preferred}\n  max_queue_delay_microseconds: {shape.delay_us}\n}}\n"
        return text.rstrip("\n") + "\n" + block
    start, end = span
    body = text[start:end]
    indent = re.search(r"\n([ \t]*)\S", body)
    pad = indent.group(1) if indent else "  "
    # Preferred sizes are written again whole, in one list; either form (repeated or [a, b]) is removed.
    body = re.sub(r"^[ \t]*preferred_batch_size\s*:\s*(\[[^\]]*\]|\d+)[ \t]*\n?", "", body, flags=re.M)
    body = _set_scalar(body, "max_queue_delay_microseconds", shape.delay_us, pad)
    if shape.preferred:
        listed = ", ".join(map(str, shape.preferred))
        body = f"\n{pad}preferred_batch_size: [ {listed} ]" + body
    return text[:start] + body + text[end:]

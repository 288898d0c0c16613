"""Extract the OpenAI schemas the conformance tests need from OpenAI's published OpenAPI document
(github.com/openai/openai-openapi, ``openapi.json``) into ``tests/contracts/openai/schemas.json``.

Only the named roots and everything they ``$ref`` transitively are kept, verbatim, under
``components.schemas`` so the spec's own ``#/components/schemas/...`` references resolve unchanged.
Nothing is rewritten here (OpenAPI's ``nullable`` is interpreted by tests/contracts/openai_schema.py),
so a refresh is a plain diff against upstream.

    python scripts/vendor_openai_schemas.py path/to/openapi.json --commit <sha>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "contracts" / "openai" / "schemas.json"
SOURCE_REPO = "https://github.com/openai/openai-openapi"
SOURCE_PATH = "openapi.json"
REF_PREFIX = "#/components/schemas/"

# What the service returns (responses) and what a generation line's body is (requests: the parser's
# accepted bodies are checked against them, and every request field must be classified by it).
DEFAULT_ROOTS = (
    "Batch",
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
    "CreateCompletionRequest",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "CreateResponse",
    "ErrorResponse",
    "Response",
)


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "$ref" and isinstance(value, str):
                    found.add(value)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def schema_closure(schemas: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    """``roots`` and every schema they reference, transitively. Only local component references exist
    in OpenAI's document; anything else is refused rather than silently left dangling."""
    kept: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        if name not in schemas:
            raise SystemExit(f"schema {name!r} is not in the document")
        kept[name] = schemas[name]
        for ref in _refs(schemas[name]):
            if not ref.startswith(REF_PREFIX):
                raise SystemExit(f"{name} references {ref!r}, which is not a local component schema")
            todo.append(ref.removeprefix(REF_PREFIX))
    return dict(sorted(kept.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path, help="OpenAI's openapi.json")
    parser.add_argument("--commit", required=True, help="the openai-openapi commit the file comes from")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--root", action="append", help="a schema to keep (repeatable; default: the test set)")
    args = parser.parse_args(argv)

    document = json.loads(args.spec.read_text(encoding="utf-8"))
    roots = tuple(args.root or DEFAULT_ROOTS)
    kept = schema_closure(document["components"]["schemas"], roots)
    subset = {
        "openapi": document["openapi"],
        "info": {"title": document["info"]["title"], "version": document["info"]["version"]},
        "x-vendored": {"repository": SOURCE_REPO, "path": SOURCE_PATH, "commit": args.commit, "roots": list(roots)},
        "components": {"schemas": kept},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(subset, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(kept)} schemas from {len(roots)} roots -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Code, configuration and docs point into docs/ by path, often with the section in quotes right after it
(docs/operations/metrics.md, "Where they are served"). A page renamed, split or retitled turns such a pointer
into a dead end. Every docs/ path named anywhere in the repository must exist, as a file or a directory, and a
section named in quotes right after a page must be one of that page's headings: its full text, or its text
before a closing parenthesis ("Layers" for "Layers (who may import whom)"). Backticks in a heading do not count.
"""

from __future__ import annotations

import re
from functools import cache

from tests.docs.test_no_development_words import ROOT, SUFFIXES, _files

# Every tracked or new file that is not ignored (.venv, var and __pycache__ are), of these kinds.
NAMES = ("Makefile",)
KINDS = (*SUFFIXES, ".example", "Dockerfile")
# Pages of the upstream backends' own repositories (tensorrtllm_backend, vllm_backend), named beside them in
# build_engines/: not this repository's docs.
UPSTREAM = frozenset(
    {"docs/guided_decoding.md", "docs/llama_multi_instance.md", "docs/health_check.md", "docs/model_config.md"}
)

# A path under docs/, not part of a longer path (tests/docs/... is a test) or a URL.
PATH = re.compile(r"(?<![\w./-])(docs/[\w.-]+(?:/[\w.-]+)*/?)")
# A comment's line break inside or before the quoted section: the newline and the next line's comment marker.
BREAK = r"\n[ \t]*(?:#|//|\*)?[ \t]*"
# The section in quotes right after the path (or its Markdown link) and a comma or a space (a quote that closes a
# string literal is no section): `, "Heading"`, ` ("Heading"`, `'s "Heading"`, `, 'Heading'`, `](page.md), "Heading"`.
LINK_TAIL = r"(?:\]\([^)\s]*\))?"
SEPARATOR = rf"(?:'s)?(?:,?[ \t]*{BREAK}|,[ \t]*|[ \t]+)\(?"
QUOTED = rf"""(?:"([^"\n]+(?:{BREAK}[^"\n]+)?)"|'([^'\n]+)')"""
SECTION = re.compile(LINK_TAIL + SEPARATOR + QUOTED)
FENCE = re.compile(r"^\s*(```|~~~)")


def _references() -> list[tuple[str, int, str, str | None]]:
    """(file, line, path, section or None) for every docs/ path named in the repository."""
    found = []
    for name in _files((".",), NAMES, KINDS):
        try:
            text = (ROOT / name).read_text()
        except UnicodeDecodeError:
            continue
        for match in PATH.finditer(text):
            path = match[1].rstrip(".")
            section = SECTION.match(text, match.end())
            named = None
            if section and path.endswith(".md") and match.end() == match.start() + len(path):
                named = re.sub(BREAK, " ", section[1] or section[2]).strip()
            found.append((name, text.count("\n", 0, match.start()) + 1, path, named))
    return found


@cache
def _headings(page: str) -> frozenset[str]:
    """A page's headings outside fenced code, each as written and without a closing parenthetical."""
    headings: set[str] = set()
    fenced = False
    for line in (ROOT / page).read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            heading = line.lstrip("#").strip().replace("`", "")
            headings.add(heading)
            headings.add(re.sub(r"\s*\([^()]*\)$", "", heading))
    return frozenset(headings)


def test_every_docs_path_named_exists_and_every_section_named_is_a_heading():
    references = _references()
    assert len(references) > 100, "the scan stopped finding the repository's pointers into docs/"
    missing = []
    for name, line, path, section in references:
        if path in UPSTREAM:
            continue
        target = ROOT / path
        if not target.exists():
            missing.append(f"{name}:{line}: {path} does not exist")
        elif section is not None and target.is_file() and section.replace("`", "") not in _headings(path):
            missing.append(f'{name}:{line}: {path} has no heading "{section}"')
    assert not missing, "pointers into docs/ that lead nowhere:\n" + "\n".join(missing)

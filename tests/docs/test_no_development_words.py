"""The repository speaks of the project only, what it is and why, never of how it was developed: no work
sessions or stops by number, no private tracker issues, no commit hashes in prose. Measured figures keep their
date and machine instead.

"Session" has technical senses too (a database, HTTP or pytest session), and hex strings are common in data
(digests, ids); the patterns below match the development senses only, by the words around them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

CODE_DIRS = ("controlplane", "triton_models", "build_engines", "deploy", "scripts", "bench", "batchctl", "tests")
CODE_FILES = ("Makefile", "README.md", "pyproject.toml", "gunicorn.conf.py", "manage.py")
SUFFIXES = (".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".pbtxt", ".json", ".txt", ".cfg", ".ini", ".conf", ".html")
TOO_LARGE = 2_000_000  # data files (captured traces, vendored schemas' bulk) say nothing of their history

HEX = r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
PATTERNS = {
    "a work session by number": re.compile(r"\bsessions?\s+\d+\b", re.I),
    "a work session": re.compile(r"\b(?:this|next|last|previous|earlier|later|that) session\b", re.I),
    "a stop by number": re.compile(r"\bstops?\s+\d+(?:\s*(?:,|and)\s*\d+)*(?=\s*[).,:;]|\s*$)", re.I | re.M),
    "a tracker issue": re.compile(r"\bissues?\s*#?\d+\b|\(issue:|(?<![\w/.-])\(#\d+\)|\bPR\s*#?\d+\b", re.I),
    "a commit hash": re.compile(rf"(?:\bcommits?\s+|\b(?:in|at|since|from|see)\s+|\()({HEX})\b"),
    "a history of names": re.compile(r"\bpredates the (?:move|rename|split)\b", re.I),
}
# A line with one of these words uses "session" in its technical sense.
TECHNICAL_SESSION = re.compile(
    r"connection|cursor|database|postgres|backend|http|cookie|login|pytest|fixture|browser|redis|tls", re.I
)
# Upstream pins name a release or a branch beside the hash (deploy/schemas/SOURCES.md): provenance, not history.
UPSTREAM_PIN = re.compile(r"\bv\d+\.\d+|\b(?:main|master) at\b|github\.com/")


def _files(dirs: tuple[str, ...], names: tuple[str, ...], suffixes: tuple[str, ...]) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *dirs, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return sorted(
        path
        for path in set(listed)
        if path
        and path != THIS
        and (path in names or path.endswith(suffixes))
        and (ROOT / path).is_file()
        and (ROOT / path).stat().st_size < TOO_LARGE
    )


def _hits(paths: list[str]) -> list[str]:
    hits = []
    for path in paths:
        try:
            text = (ROOT / path).read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in PATTERNS.items():
                if not pattern.search(line):
                    continue
                if what == "a work session" and TECHNICAL_SESSION.search(line):
                    continue
                if what == "a commit hash" and UPSTREAM_PIN.search(line):
                    continue
                hits.append(f"{path}:{number}: {what}: {line.strip()[:160]}")
    return hits


def test_code_and_configuration_say_nothing_of_how_they_were_developed():
    paths = _files(CODE_DIRS, CODE_FILES, SUFFIXES)
    assert len(paths) > 300, "the scan stopped finding the repository's files"
    hits = _hits(paths)
    assert not hits, "say the fact without the history (house rule):\n" + "\n".join(hits)


def test_docs_say_nothing_of_how_the_project_was_developed():
    paths = _files(("docs",), (), (".md",))
    assert len(paths) > 10, "the scan stopped finding the docs"
    hits = _hits(paths)
    assert not hits, "say the fact without the history (house rule):\n" + "\n".join(hits)

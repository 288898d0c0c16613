"""docs/operations/configuration.md is the reference of every environment variable the control plane reads,
written by scripts/config_reference.py from what the settings record as they read (controlplane/core/env.py).
Every variable read must carry a meaning, and the committed file must be what the generator writes."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from scripts.config_reference import COMMAND, OUTPUT, render, variables

ROOT = Path(__file__).resolve().parents[2]
# Reads of a named variable: through the typed readers, or straight from os.environ (which must then be listed
# with env_declare).
READS = (
    re.compile(r"\benv_[a-z_]+\(\s*\"([A-Z][A-Z0-9_]*)\""),
    re.compile(r"\bos\.(?:environ\.get|environ\.setdefault|environ\.pop|getenv)\(\s*\"([A-Z][A-Z0-9_]*)\""),
    re.compile(r"\bos\.environ\[\s*\"([A-Z][A-Z0-9_]*)\"\s*\]"),
)


@pytest.fixture(scope="module")
def registry() -> list[dict[str, str]]:
    return variables()


def _sources() -> list[Path]:
    return [*sorted((ROOT / "controlplane").rglob("*.py")), ROOT / "gunicorn.conf.py", ROOT / "manage.py"]


def test_every_variable_read_has_a_meaning(registry):
    registered = {row["name"] for row in registry}
    assert len(registered) > 100, "the settings stopped recording what they read"
    without = [row["name"] for row in registry if not row["meaning"].strip() or "\n" in row["meaning"]]
    assert not without, f"these variables need a one-line meaning (help=) where they are read: {without}"
    unlisted = []
    for path in _sources():
        text = path.read_text()
        for pattern in READS:
            for match in pattern.finditer(text):
                if match[1] not in registered:
                    line = text.count("\n", 0, match.start()) + 1
                    unlisted.append(f"{path.relative_to(ROOT)}:{line}: {match[1]}")
    assert not unlisted, (
        "read but missing from the configuration reference: read them through controlplane.core.env's readers "
        "in the settings, with help=, or list them with env_declare:\n" + "\n".join(unlisted)
    )


def test_the_committed_reference_is_current(registry):
    expected = render(registry)
    committed = OUTPUT.read_text() if OUTPUT.exists() else ""
    if committed != expected:
        diff = difflib.unified_diff(
            committed.splitlines(), expected.splitlines(), "committed", "generated", lineterm="", n=1
        )
        shown = "\n".join(list(diff)[:40])
        pytest.fail(f"{OUTPUT.relative_to(ROOT)} is out of date: run `{COMMAND}` and commit it.\n{shown}")

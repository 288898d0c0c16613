"""docs/architecture/ names files and functions as the way in to the code; a renamed or moved one makes the
map lie. Every path a page names must exist, every `module.name` it names (``scheduling/runner.shard_run_next``)
must be defined in that module, and every page it links to must exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "architecture"
OVERVIEW_MAX_LINES = 400
# Paths are written relative to the repository root, to controlplane/ (the apps), or to a model's directory.
BASES = ("", "controlplane/", "deploy/", "docs/")
EXTENSIONS = "py|yaml|yml|md|json|jsonl|sh|toml|pbtxt|html"
PATH = re.compile(rf"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.(?:{EXTENSIONS}))(?!\w)(?!\.\w)")
# `app/module.name` or `app/sub/module.name`: a function, class or constant of that module.
MODULE_NAME = re.compile(r"(?<![\w./-])((?:[a-z_]+/)+[a-z_]+)\.([A-Za-z_][A-Za-z0-9_]*)(?![\w(/])")


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _text() -> str:
    return "\n".join(page.read_text() for page in _pages())


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def _exists(path: str, tracked: list[str]) -> bool:
    if any((ROOT / base / path).exists() for base in BASES):
        return True
    # A path inside a model's or a generated directory ("1/model.py"): some tracked file ends with it.
    return any(name.endswith("/" + path) for name in tracked)


def test_every_path_named_exists():
    tracked = _tracked()
    text = _text()
    named = sorted(set(PATH.findall(text)))
    assert len(named) > 50, "the pattern stopped finding the map's paths"
    missing = [path for path in named if not _exists(path, tracked)]
    assert not missing, f"docs/architecture/ names files that do not exist: {missing}"


def test_every_path_the_other_docs_name_exists():
    """The operations pages, performance, reliability and the GPU checks name code paths too."""
    tracked = _tracked()
    pages = [page for page in sorted((ROOT / "docs").rglob("*.md")) if DOCS not in page.parents]
    assert len(pages) > 10, "the docs moved: point this test at them"
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in pages
        for path in sorted(set(PATH.findall(page.read_text())))
        if not _exists(path, tracked)
    ]
    assert not missing, f"these docs name files that do not exist: {missing}"


@pytest.mark.parametrize("base", ["controlplane", "deploy"])
def test_every_module_name_named_is_defined(base):
    text = _text()
    checked, missing = 0, []
    for module, name in sorted(set(MODULE_NAME.findall(text))):
        source = ROOT / base / f"{module}.py"
        if not source.exists() or name in {"py", "md"}:
            continue
        checked += 1
        code = source.read_text()
        defined = re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]", code, re.M)
        if not defined:
            missing.append(f"{base}/{module}.py: {name}")
    if base == "controlplane":
        assert checked > 8, "the pattern stopped finding the map's module.name references"
    assert not missing, f"docs/architecture/ names what these modules do not define: {missing}"


APPS = ("batches", "fleet", "scheduling", "core", "console", "webhooks", "usage", "files", "tenants", "metrics")
TASK = re.compile(rf"`((?:{'|'.join(APPS)})\.[a-z_]+)`")


def test_every_task_named_is_registered():
    """`batches.shards_rescue` and the like are Celery task names (beat's schedule, the routing table): each must
    be a name some task is registered under, or (`usage.total_tokens`) a field or name the app defines."""
    code = "\n".join(path.read_text() for path in (ROOT / "controlplane").rglob("*.py"))
    named = sorted(set(TASK.findall(_text())))
    assert len(named) > 8, "the pattern stopped finding the map's task names"
    registered = set(re.findall(r"""shared_task\([^)]*name=["']([\w.]+)["']""", code))
    missing = [
        name
        for name in named
        if name not in registered and f'"{name}"' not in code and not _app_defines(*name.split(".", 1))
    ]
    assert not missing, f"docs/architecture/ names tasks nobody registers: {missing}"


def _app_defines(app: str, name: str) -> bool:
    if (ROOT / "controlplane" / app / f"{name}.py").exists() or (ROOT / "controlplane" / app / name).is_dir():
        return True  # `files.models`: a module of the app
    source = "\n".join(path.read_text() for path in (ROOT / "controlplane" / app).rglob("*.py"))
    return re.search(rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|[\"']{name}[\"']", source, re.M) is not None


LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)")


def test_every_page_linked_exists_and_every_page_is_linked_from_the_overview():
    pages = {page.name for page in _pages()}
    assert "README.md" in pages, "docs/architecture/README.md is the overview"
    broken = [
        f"{page.name} -> {target}"
        for page in _pages()
        for target in LINK.findall(page.read_text())
        if not (page.parent / target).resolve().exists()
    ]
    assert not broken, f"docs/architecture/ links to pages that do not exist: {broken}"
    linked = set(LINK.findall((DOCS / "README.md").read_text()))
    unlinked = sorted(pages - linked - {"README.md"})
    assert not unlinked, f"the overview does not link these pages: {unlinked}"


def test_the_overview_stays_short():
    lines = len((DOCS / "README.md").read_text().splitlines())
    assert lines <= OVERVIEW_MAX_LINES, f"docs/architecture/README.md has {lines} lines; keep detail on the pages"

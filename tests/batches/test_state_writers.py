"""One writer per state machine (docs/architecture/README.md, "Who writes which state"): a shard's ``status`` is
written only by batches/shards.py, a batch's ``status`` and ``stop_reason`` only by batches/transitions.py,
where each change records its event (and a batch's terminal one its webhook). The scan reads every module of
controlplane/ (migrations aside) and reports any other write:

- ``status=`` / ``stop_reason=`` (or ``defaults={"status": …}``) passed to ``update``, ``create``,
  ``get_or_create``, ``update_or_create`` or a model constructor, on a query rooted at ``Shard`` / ``Batch``,
  a related manager (``.shards`` / ``.batches``), or a name assigned from one;
- ``bulk_update(…, ["status"])`` on such a query;
- ``<x>.status = …`` / ``<x>.stop_reason = …`` in a module that imports ``Shard`` or ``Batch``;
- raw SQL that updates the column.

Rows created in their initial state (a batch in ``validating``, shards ``pending``) leave the field to its
default and are not transitions. The last tests feed the scanner writes put back elsewhere, so it cannot
quietly stop finding them."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROLPLANE = ROOT / "controlplane"
OWNERS = {"Shard": "controlplane/batches/shards.py", "Batch": "controlplane/batches/transitions.py"}
FIELDS = {"Shard": {"status"}, "Batch": {"status", "stop_reason"}}
RELATED = {"shards": "Shard", "batches": "Batch"}
WRITE_CALLS = {"update", "create", "get_or_create", "update_or_create"}
RAW_SQL = re.compile(r"UPDATE\s+\"?batches_(shard|batch)\"?\s+SET\b[^;]*\b(status|stop_reason)\b", re.I | re.S)


def _root_model(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The model a query expression starts from: ``Shard.objects…``, ``batch.shards…``, or a local name
    assigned from one."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            if node.attr in RELATED:
                return RELATED[node.attr]
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            if node.id in OWNERS:
                return node.id
            return aliases.get(node.id)
        else:
            return None


def _written_fields(call: ast.Call) -> set[str]:
    names = {kw.arg for kw in call.keywords if kw.arg}
    for kw in call.keywords:
        if kw.arg == "defaults" and isinstance(kw.value, ast.Dict):
            names |= {k.value for k in kw.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return names


def _imported_models(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "controlplane.batches.models":
            found |= {alias.name for alias in node.names if alias.name in OWNERS}
    return found


def writes_of(source: str, path: str) -> list[str]:
    """Each write of a shard's or batch's state in ``source`` that ``path`` does not own, as ``path:line``."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local names bound to a query of a model (flow-insensitive: safe side)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            model = _root_model(node.value, aliases)
            if model is not None:
                aliases[node.targets[0].id] = model
    imported = _imported_models(tree)
    found: list[str] = []

    def report(model: str, line: int, what: str) -> None:
        if OWNERS[model] != path:
            found.append(f"{path}:{line}: {model} {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in OWNERS:  # Shard(status=…)
                if _written_fields(node) & FIELDS[func.id]:
                    report(func.id, node.lineno, "constructed with its state")
            elif isinstance(func, ast.Attribute) and func.attr in WRITE_CALLS | {"bulk_update"}:
                model = _root_model(func.value, aliases)
                if model is None:
                    continue
                if func.attr == "bulk_update":
                    fields = {c.value for arg in node.args[1:] for c in ast.walk(arg) if isinstance(c, ast.Constant)}
                    fields |= {
                        c.value for kw in node.keywords for c in ast.walk(kw.value) if isinstance(c, ast.Constant)
                    }
                else:
                    fields = _written_fields(node)
                written = fields & FIELDS[model]
                if written:
                    report(model, node.lineno, f"{', '.join(sorted(written))} written by .{func.attr}()")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    for model in sorted(imported):
                        if target.attr in FIELDS[model]:
                            report(model, node.lineno, f".{target.attr} assigned")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = RAW_SQL.search(node.value)
            if match:
                report("Shard" if match.group(1).lower() == "shard" else "Batch", node.lineno, "written in SQL")
    return found


def test_only_the_owner_modules_write_shard_and_batch_state():
    modules = sorted(p for p in CONTROLPLANE.rglob("*.py") if "migrations" not in p.parts)
    assert len(modules) > 100  # the scan reads the whole control plane
    found = [w for p in modules for w in writes_of(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "state written outside its owner module:\n" + "\n".join(found)


def test_the_owners_do_write_the_state():
    """The scan recognises the owners' own writes: were it blind to them, it would pass anything."""
    for model, path in OWNERS.items():
        source = (ROOT / path).read_text()
        assert writes_of(source, "elsewhere.py"), f"no {model} write found in {path}"


def _scan(code: str, path: str = "controlplane/batches/results/finalize.py") -> list[str]:
    return writes_of(textwrap.dedent(code), path)


def test_a_write_put_back_elsewhere_is_found():
    # The shapes the service used to have: a filtered update, through a query bound to a name, a related
    # manager, an attribute saved, a create with its state, a bulk update and raw SQL.
    assert _scan("Shard.objects.filter(id=1, status='pending').update(status='skipped')")
    assert _scan("""
        current = Batch.objects.filter(id=batch_id)
        if attempt:
            current = current.filter(validation_attempt=attempt)
        current.update(status='failed', failed_at=now)
    """)
    assert _scan("batch.shards.filter(status='pending').update(status='skipped')")
    assert _scan("tenant.batches.update(stop_reason='cancel')")
    assert _scan("""
        from controlplane.batches.models import Shard
        shard = Shard.objects.get(id=1)
        shard.status = 'dead'
        shard.save()
    """)
    assert _scan("Batch.objects.create(tenant=t, status='failed')")
    assert _scan("Shard.objects.update_or_create(id=1, defaults={'status': 'pending'})")
    assert _scan("Shard(batch_id=b, index=0, status='running')")
    assert _scan("Shard.objects.bulk_update(rows, ['status', 'finished_at'])")
    assert _scan("cursor.execute('UPDATE batches_shard SET status = %s WHERE id = %s', args)")


def test_what_is_not_a_state_write_is_not_reported():
    # Other fields of the rows, other models' status, reads, and the owners' own writes.
    assert not _scan("Shard.objects.filter(status='running').update(triton_server='a')")
    assert not _scan("Batch.objects.filter(id=b).update(last_dispatched_at=now, priority='high')")
    assert not _scan("Placement.objects.filter(id=p).update(status='ready')")
    assert not _scan("Shard.objects.bulk_create(shard_rows(batch_id, plans))")
    assert not _scan("self.status = status")  # a module that holds no Shard or Batch (triton/errors.py)
    assert not _scan("Shard.objects.filter(id=1).update(status='x')", OWNERS["Shard"])
    assert not _scan("Batch.objects.filter(id=1).update(status='x')", OWNERS["Batch"])
    assert _scan("Batch.objects.filter(id=1).update(status='x')", OWNERS["Shard"])  # each owns its own

"""Rolling upgrades (docs/operations/upgrades.md): workers of two releases share queues and rows, so what
one release sends or writes the other must read. deploy/upgrade/contract.json records the last release's
task signatures, status values and newest migration per app; these tests fail when a change would break a
worker of that release:
- a task it sends is gone, or takes other positional arguments (only trailing optional ones may be added);
- a status value it writes or reads is gone;
- a newer migration adds a column that release's INSERTs would leave NULL (only nullable columns, columns
  with a database default, or columns of tables created in the same migration may be added) or removes one.

Cutting a release: `python -m tests.deploy.test_upgrade_contract --write` records the new contract."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import pytest

CONTRACT = Path(__file__).resolve().parents[2] / "deploy" / "upgrade" / "contract.json"
STATUS_ENUMS = {
    "batch": "controlplane.batches.models:BatchStatus",
    "shard": "controlplane.batches.models:ShardStatus",
    "stop_reason": "controlplane.batches.models:StopReason",
    "placement": "controlplane.fleet.models:PlacementStatus",
    "server": "controlplane.fleet.models:ServerState",
    "slot": "controlplane.scheduling.models:SlotState",
    "delivery": "controlplane.webhooks.models:DeliveryStatus",
}
APPS = ("core", "tenants", "files", "fleet", "batches", "scheduling", "webhooks", "usage", "console")


def _tasks() -> dict[str, dict[str, Any]]:
    from controlplane.celery import app

    app.loader.import_default_modules()
    found = {}
    for name, task in app.tasks.items():
        if name.startswith("celery."):
            continue
        params = inspect.signature(task.run).parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        found[name] = {
            "params": [p.name for p in positional],
            "required": [p.name for p in positional if p.default is p.empty],
        }
    return found


def _statuses() -> dict[str, list[str]]:
    found = {}
    for key, path in STATUS_ENUMS.items():
        module, _, attr = path.partition(":")
        found[key] = sorted(getattr(importlib.import_module(module), attr).values)
    return found


def _migrations() -> dict[str, list[str]]:
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    return {app: sorted(name for (label, name) in loader.disk_migrations if label == app) for app in APPS}


def _current() -> dict[str, Any]:
    return {
        "tasks": _tasks(),
        "statuses": _statuses(),
        "latest_migration": {app: names[-1] for app, names in _migrations().items() if names},
    }


@pytest.fixture(scope="module")
def contract() -> dict[str, Any]:
    return json.loads(CONTRACT.read_text())


def test_every_task_of_the_last_release_still_takes_its_messages(contract):
    now = _tasks()
    for name, old in contract["tasks"].items():
        assert name in now, f"task {name} is gone: workers of the last release still send it"
        new = now[name]
        assert new["params"][: len(old["params"])] == old["params"], f"{name}: positional arguments changed"
        assert new["required"] == old["required"], f"{name}: new arguments must be optional"


def test_every_status_value_of_the_last_release_is_still_known(contract):
    now = _statuses()
    for key, values in contract["statuses"].items():
        missing = sorted(set(values) - set(now[key]))
        assert not missing, f"{key} status values {missing} are gone: the last release writes them"


def _column_changes(app: str, name: str) -> list[str]:
    """What in one migration an older release's code could not live with."""
    from django.db import migrations

    module = importlib.import_module(f"controlplane.{app}.migrations.{name}")
    created = {op.name.lower() for op in module.Migration.operations if isinstance(op, migrations.CreateModel)}
    problems = []
    for op in module.Migration.operations:
        if isinstance(op, migrations.AddField) and op.model_name.lower() not in created:
            field = op.field
            if not (field.null or field.has_db_default() or field.many_to_many):
                problems.append(f"{app}.{name}: {op.model_name}.{op.name} is NOT NULL without a database default")
        elif isinstance(op, migrations.RemoveField | migrations.RenameField | migrations.DeleteModel):
            problems.append(f"{app}.{name}: {type(op).__name__} breaks the last release's queries")
    return problems


def test_migrations_since_the_last_release_only_expand(contract):
    problems = []
    for app, names in _migrations().items():
        last = contract["latest_migration"].get(app)
        newer = [n for n in names if last is None or n > last]
        for name in newer:
            problems += _column_changes(app, name)
    assert not problems, "\n".join(problems)


def test_the_expand_rule_catches_a_not_null_column():
    from django.db import migrations, models

    operations = [migrations.AddField("shard", "lane", models.CharField(max_length=8, default="x"))]
    module = type(sys)("controlplane.batches.migrations.9999_probe")
    module.Migration = type("Migration", (migrations.Migration,), {"operations": operations})  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert _column_changes("batches", "9999_probe") == [
            "batches.9999_probe: shard.lane is NOT NULL without a database default"
        ]
    finally:
        del sys.modules[module.__name__]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import django

    sys.path.insert(0, str(CONTRACT.parents[2]))
    django.setup()
    CONTRACT.write_text(json.dumps(_current(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {CONTRACT}")

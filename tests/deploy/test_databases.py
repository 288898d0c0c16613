"""The migrated template that stacks' and pytest workers' databases are copied from (deploy/local/databases.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from deploy.local import databases
from deploy.local.databases import REPO_ROOT, migrated_database, migrated_template


def test_a_copy_has_every_migration_applied_and_is_dropped_afterwards():
    with migrated_database("cp_copytest") as url:
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
        env.setdefault("DJANGO_SECRET_KEY", "copy-test")
        # --check: exit 1 when any migration is unapplied.
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), "migrate", "--check"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        name = url.rsplit("/", 1)[1]
    with psycopg.connect(databases.ADMIN_DB_URL, autocommit=True) as conn:
        assert not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()


def test_the_template_is_built_once_and_named_by_its_migrations():
    name = migrated_template()
    assert name == databases.TEMPLATE_PREFIX + databases.migrations_digest()
    assert migrated_template() == name


def test_a_changed_migration_or_seed_changes_the_templates_name(tmp_path, monkeypatch):
    migrations = tmp_path / "controlplane" / "batches" / "migrations"
    migrations.mkdir(parents=True)
    (migrations / "0001_initial.py").write_text("operations = []\n")
    monkeypatch.setattr(databases, "REPO_ROOT", tmp_path)
    before = databases.migrations_digest()
    (migrations / "0001_initial.py").write_text("operations = [1]\n")
    changed = databases.migrations_digest()
    (migrations / "0002_more.py").write_text("operations = []\n")
    added = databases.migrations_digest()
    (tmp_path / "controlplane" / "seed.py").write_text("SEED = []\n")  # what a data migration imports
    assert len({before, changed, added, databases.migrations_digest()}) == 4

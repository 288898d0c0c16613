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


def test_a_new_template_drops_only_old_ones_nobody_is_copying(monkeypatch):
    # Two checkouts of different code on one server each build their own template: neither may drop the other's
    # newest, nor one a run is connected to (copying from it); a build that died is always dropped.
    prefix = "cp_droptest_"
    monkeypatch.setattr(databases, "TEMPLATE_PREFIX", prefix)
    names = [f"{prefix}{i}" for i in range(5)]
    with psycopg.connect(databases.ADMIN_DB_URL, autocommit=True) as admin:
        for name in [*names, f"{prefix}5_partial"]:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            with psycopg.connect(databases.database_url(databases.ADMIN_DB_URL, names[0])):
                databases._drop_stale_templates(admin)
                left = {
                    row[0]
                    for row in admin.execute(
                        "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,)
                    )
                }
                # The newest KEEP_TEMPLATES - 1 (room for the one being built) and the one in use.
                assert left == {names[0], *names[-(databases.KEEP_TEMPLATES - 1) :]}
            databases._drop_stale_templates(admin)
            left = {
                row[0]
                for row in admin.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,))
            }
            assert left == set(names[-(databases.KEEP_TEMPLATES - 1) :])
        finally:
            for name in [*names, f"{prefix}5_partial"]:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

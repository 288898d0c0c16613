"""Throwaway Postgres databases for local stacks and test runs, copied from a migrated template.

Migrating an empty database took 3.1 CPU-s here against 1.4 for a `migrate` that finds nothing to do, and the
suite makes one database for each stack and one for each pytest worker (docs/performance.md). The
template is migrated once and copied (CREATE DATABASE … TEMPLATE); whoever uses a copy still runs `migrate`, as
production does, and finds nothing to do. The template's name carries a hash of the control plane's code and of
Django's version, so a changed migration (or anything a data migration imports) makes a new template and the old
one is dropped. It is built under another name
and renamed once complete (a build that died leaves nothing that looks finished), under an advisory lock, so
pytest-xdist workers and checkouts side by side build it once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN_DB_URL = os.environ.get("E2E_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TEMPLATE_PREFIX = "cp_template_"
_LOCK_KEY = 7_364_013_297  # any constant: the advisory lock that serialises template builds on this server


def migrations_digest() -> str:
    """Every control-plane module, not only the migrations: data migrations import the code they seed from
    (fleet/catalogue/seed.py), so a template named by the migrations alone could outlive a change to what they write."""
    digest = hashlib.sha256(version("django").encode())
    for path in sorted(REPO_ROOT.glob("controlplane/**/*.py")):
        digest.update(str(path.relative_to(REPO_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def database_url(admin_url: str, name: str) -> str:
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def migrated_template(admin_url: str = ADMIN_DB_URL) -> str:
    """The name of a database holding every migration applied, built here if no run built it yet."""
    name = TEMPLATE_PREFIX + migrations_digest()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                _drop_stale_templates(conn)
                partial = f"{name}_partial"
                conn.execute(f'CREATE DATABASE "{partial}"')
                _migrate(database_url(admin_url, partial))
                conn.execute(f'ALTER DATABASE "{partial}" RENAME TO "{name}"')
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return name


# Other checkouts' templates kept (a second worktree, a branch, a CI job beside a developer's run on one server):
# dropping every other template made two checkouts of different code drop each other's in turn, under the
# stacks copying from it. The newest are kept; older ones go when nothing is connected to them.
KEEP_TEMPLATES = 4


def _drop_stale_templates(conn: psycopg.Connection) -> None:
    """Under the build lock: a build that died (``_partial``) and all but the newest KEEP_TEMPLATES templates."""
    rows = conn.execute(
        "SELECT datname FROM pg_database WHERE starts_with(datname, %s) ORDER BY oid DESC", (TEMPLATE_PREFIX,)
    ).fetchall()
    complete = [name for (name,) in rows if not name.endswith("_partial")]
    for name in [name for (name,) in rows if name.endswith("_partial")]:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for name in complete[KEEP_TEMPLATES - 1 :]:  # room for the one about to be built
        with contextlib.suppress(psycopg.errors.ObjectInUse):  # being copied now: a later build drops it
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _migrate(url: str) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DJANGO_SECRET_KEY": "template-" + secrets.token_urlsafe(32),  # migrations sign nothing
    }
    command = [sys.executable, str(REPO_ROOT / "manage.py"), "migrate", "--noinput", "-v0"]
    result = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"migrating the template database failed:\n{result.stdout}{result.stderr}")


@contextlib.contextmanager
def migrated_database(prefix: str, admin_url: str = ADMIN_DB_URL) -> Iterator[str]:
    """A new database, a copy of the migrated template (its URL), dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for attempt in range(3):
            template = migrated_template(admin_url)
            try:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
                break
            except psycopg.errors.InvalidCatalogName:
                # Dropped in between by a checkout with other code building its own (a mutation run beside
                # the suite): build or find ours again.
                if attempt == 2:
                    raise
    try:
        yield database_url(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

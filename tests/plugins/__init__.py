"""The suite's own machinery, as pytest plugins that tests/conftest.py registers: how the tests are spread over
xdist workers (scheduling), how the test databases are made and flushed (database, flush), and where the suite's
CPU goes (cpu_ledger)."""

from __future__ import annotations

import pytest


def with_django(config: pytest.Config) -> bool:
    """False under ``-p no:django``: the pure property tests (planner, sizing, policy) run without Django."""
    return config.pluginmanager.hasplugin("django")

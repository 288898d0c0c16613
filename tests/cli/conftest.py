from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from tests.cli.fake_api import FakeAPI


@pytest.fixture
def fake_api() -> Iterator[FakeAPI]:
    with FakeAPI() as api:
        yield api


@pytest.fixture
def cli(fake_api, monkeypatch):
    """Run batchctl in-process against the fake API: ``cli("status", "batch_1")`` → click's Result."""
    from batchctl.console import err, out
    from batchctl.main import app

    for name in ("BATCHCTL_API_KEY", "OPENAI_API_KEY", "BATCHCTL_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    # Plain output whatever the environment (FORCE_COLOR in CI): rich settles interactivity and colours when
    # the consoles are made, at import.
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    for console in (out, err):
        monkeypatch.setattr(console, "is_interactive", False)
        monkeypatch.setattr(console, "_color_system", None)
        # The width follows COLUMNS as each test sets it: rich fixes it at construction when COLUMNS was set
        # then (in a suite worker, whichever test imported batchctl first decided it for the rest).
        monkeypatch.setattr(console, "_width", None)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, ["--api-key", "sk-test", "--base-url", fake_api.base_url, *args])

    return invoke

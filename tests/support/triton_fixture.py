"""Reusable pytest fixtures: a real tritonserver (from the nvidia-pytriton wheel) for a whole session.

Use from any suite's conftest.py (the repo root must be on sys.path, as with `python -m pytest`):

    from tests.support.triton_fixture import (  # noqa: F401 - pytest finds fixtures/hooks by name
        pytest_runtest_makereport, triton_client, triton_model_repository, triton_server,
    )

or once, from the root conftest: `pytest_plugins = ["tests.support.triton_fixture"]`.
Override `triton_model_repository` to serve another repository. The server starts in explicit mode with
nothing loaded; load what you need through `triton_client.ensure_loaded(...)` once per session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.triton.client import TritonClient
from deploy.local.triton_server import DEFAULT_MODEL_REPOSITORY, LocalTriton, running_local_server


@pytest.fixture(scope="session")
def triton_model_repository() -> Path:
    return DEFAULT_MODEL_REPOSITORY


@pytest.fixture(scope="session")
def triton_server(triton_model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """A running server on free ports: `.grpc_url` (host:port), `.http_url`, `.metrics_url`, `.log_path`."""
    log_path = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with running_local_server(triton_model_repository, log_path=log_path) as server:
        yield server


@pytest.fixture(scope="session")
def triton_client(triton_server: LocalTriton) -> Iterator[TritonClient]:
    client = TritonClient(triton_server.grpc_url, timeout_s=120.0)
    yield client
    client.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    # A failing test that used the server gets the server's log tail in its report: the real cause
    # (a stub that could not import torch, a model that failed to load) is usually only there.
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    server = getattr(item, "funcargs", {}).get("triton_server")
    if report.failed and isinstance(server, LocalTriton):
        report.sections.append(("tritonserver log (tail)", server.log_tail(80)))

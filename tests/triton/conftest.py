"""Fixtures for the Triton adapter suite: one real server and one MiniLM load for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.triton.client import TritonClient
from deploy.local.inprocess import InProcessMiniLM
from tests.support.triton_fixture import (  # pytest finds fixtures and hooks by name
    pytest_runtest_makereport,
    triton_client,
    triton_model_repository,
    triton_server,
)


@pytest.fixture(scope="session")
def minilm(triton_client: TritonClient) -> Iterator[TritonClient]:
    """The session client, with the minilm model loaded (once: loading costs seconds)."""
    triton_client.ensure_loaded("minilm")
    yield triton_client


@pytest.fixture(scope="session")
def identity(triton_client: TritonClient) -> Iterator[TritonClient]:
    triton_client.ensure_loaded("identity")
    yield triton_client


@pytest.fixture(scope="session")
def inprocess_minilm() -> InProcessMiniLM:
    return InProcessMiniLM()

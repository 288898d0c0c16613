"""pytest plugin for scripts/mutation.py: which test calls which function of the module under mutation.

Loaded with ``-p scripts.mutation_calls`` on one unmutated run of the module's tests. A profile hook (function
entries only, no line tracing, in every thread) notes, for each test (setup, call and teardown), the first line
of each code object of the module that ran; and the test's duration. Written as JSON to MUTATION_CALLS_OUT:
``{"tests": {nodeid: {"seconds": s, "code_lines": [first lines]}}}``. The runner then runs, for a mutant
inside a function, only the tests that entered that function, fastest first.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

_TARGET = str(Path(os.environ["MUTATION_TARGET"]).resolve())
_current: set[int] | None = None
_tests: dict[str, dict[str, Any]] = {}
_is_target: dict[str, bool] = {}  # co_filename → whether it is the module (resolved once per file name)


def _profile(frame: FrameType, event: str, arg: object) -> None:
    # "call" fires on entry to a Python function (and on each resume of a generator), in the calling thread.
    if event != "call" or _current is None:
        return
    filename = frame.f_code.co_filename
    if filename not in _is_target:
        _is_target[filename] = str(Path(filename).resolve()) == _TARGET
    if _is_target[filename]:
        _current.add(frame.f_code.co_firstlineno)


def pytest_configure(config: pytest.Config) -> None:
    sys.setprofile(_profile)
    threading.setprofile(_profile)  # threads the tests start (the concurrent-claim tests) are profiled too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    global _current
    _current = set()
    started = time.monotonic()
    yield
    _tests[item.nodeid] = {"seconds": time.monotonic() - started, "code_lines": sorted(_current)}
    _current = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    Path(os.environ["MUTATION_CALLS_OUT"]).write_text(json.dumps({"tests": _tests}, indent=1))

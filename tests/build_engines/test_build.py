"""build on a machine without an NVIDIA GPU or TensorRT: exit 4 and one sentence, nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest

from build_engines.gpu import cannot_build_reason, detect_gpu, tensorrt_available
from tests.build_engines.conftest import REPO_ROOT

can_build_here = detect_gpu() is not None and tensorrt_available()


@pytest.mark.skipif(can_build_here, reason="this machine has a GPU and tensorrt: build really runs")
def test_build_exits_4_with_one_sentence(built):
    done = subprocess.run(
        [sys.executable, "-m", "build_engines", "build", str(built.spec), "--out", str(built.out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 4
    message = done.stderr.strip().removeprefix("error: ")
    assert "\n" not in message and message.count(". ") == 0 and message.endswith(".")
    assert message.startswith("Cannot build a TensorRT plan here because")
    assert "export and verify still work" in message
    assert not list(built.out.glob("trt-*/model.plan"))


@pytest.mark.skipif(can_build_here, reason="this machine has a GPU and tensorrt: build really runs")
def test_all_reports_the_skipped_build_without_failing(built):
    assert built.exit_code == 0
    assert "skipped: Cannot build a TensorRT plan here" in built.stdout


def test_reason_names_each_missing_piece():
    from build_engines.gpu import GpuInfo

    gpu = GpuInfo("NVIDIA H100", "9.0")
    assert cannot_build_reason(gpu, True) is None
    assert "`tensorrt` Python module" in cannot_build_reason(gpu, False)
    only_gpu = cannot_build_reason(None, True)
    assert "no NVIDIA GPU" in only_gpu and "tensorrt" not in only_gpu

"""deploy/local/triton_server.py: backend preparation, environment; and the foreground CLI
(`python -m deploy.local.triton_serve`) on a fresh server."""

from __future__ import annotations

import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from controlplane.triton.client import TritonClient
from deploy.local.triton_server import (
    REPO_ROOT,
    build_env,
    free_port,
    log_tail,
    prepare_backend_dir,
    server_command,
    wait_until_ready,
)


def test_prepare_backend_dir_is_idempotent(tmp_path: Path) -> None:
    backends = prepare_backend_dir(tmp_path / "backends")
    python_dir = backends / "python"
    names = {p.name for p in python_dir.iterdir()}
    assert {"libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"} <= names
    stub_inode = (python_dir / "triton_python_backend_stub").stat().st_ino
    prepare_backend_dir(tmp_path / "backends")
    assert (python_dir / "triton_python_backend_stub").stat().st_ino == stub_inode, "unchanged file was copied again"


def test_gpu_metrics_follow_the_host_unless_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def command() -> list[str]:
        return server_command(tmp_path, 1, 2, 3, tmp_path)

    monkeypatch.setenv("LOCAL_TRITON_GPU", "1")
    assert "--allow-gpu-metrics=true" in command()
    monkeypatch.setenv("LOCAL_TRITON_GPU", "0")
    assert "--allow-gpu-metrics=false" in command()
    monkeypatch.delenv("LOCAL_TRITON_GPU")
    on_gpu_host = Path("/dev/nvidiactl").exists() and Path("/dev/nvidia0").exists()
    assert f"--allow-gpu-metrics={str(on_gpu_host).lower()}" in command()


def test_env_puts_interpreter_libdir_first_and_site_packages_on_path() -> None:
    env = build_env({"LD_LIBRARY_PATH": "/elsewhere", "PATH": "/usr/bin"})
    lib_dirs = env["LD_LIBRARY_PATH"].split(":")
    assert lib_dirs[0] == sysconfig.get_config_var("LIBDIR")
    assert any(d.endswith("nvidia_pytriton.libs") for d in lib_dirs)
    assert lib_dirs[-1] == "/elsewhere"
    assert sysconfig.get_paths()["purelib"] in env["PYTHONPATH"].split(":")
    assert env["HF_HUB_OFFLINE"] == "1"


def test_cli_starts_explicit_mode_with_nothing_loaded_and_stops_on_sigterm(tmp_path: Path) -> None:
    http, grpc, metrics = free_port(), free_port(), free_port()
    log_path = tmp_path / "cli.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deploy.local.triton_serve",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--log-path",
            str(log_path),
        ],
        cwd=REPO_ROOT,
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{http}", 60, proc=proc, log_path=log_path)
        wait_until_ready(f"127.0.0.1:{grpc}", 10, proc=proc, log_path=log_path)
        with TritonClient(f"127.0.0.1:{grpc}") as client:
            index = {m["name"]: m for m in client.repository_index()}
            assert {"minilm", "identity"} <= set(index), "repository is visible"
            assert all(m.get("state") != "READY" for m in index.values()), "explicit mode loads nothing"
            assert not client.is_model_ready("minilm")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_tail(log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

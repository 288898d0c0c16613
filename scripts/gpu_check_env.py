"""scripts/gpu_check.py's environment on a GPU machine: what scripts/gpu_pack.py packed, unpacked; numpy 1
for Triton 2.51's python stub where the machine's Python has numpy 2."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

UNPACK = Path("/tmp/gpu_check")


class Skip(Exception):
    """A step cannot run here; the message says why (shared by the steps in gpu_check*.py)."""


def unpack(pack: Path) -> tuple[Path | None, Path | None]:
    """Unpack the server (where this Python has no nvidia-pytriton) and the weights from scripts/gpu_pack.py's
    folder; return the folder to put on the path (or None) and the weights' folder (or None)."""
    site = UNPACK / "site"
    if importlib.util.find_spec("pytriton") is None and (pack / "triton.tar.xz").exists():
        if not (site / "pytriton").exists():
            with tarfile.open(pack / "triton.tar.xz") as tar:
                tar.extractall(site, filter="tar")
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    weights = UNPACK / "minilm"
    if (pack / "minilm.tar.xz").exists() and not weights.exists():
        with tarfile.open(pack / "minilm.tar.xz") as tar:
            tar.extractall(UNPACK, filter="tar")
    return (site if str(site) in sys.path else None), (weights if weights.exists() else None)


def numpy1_env(pack: Path) -> None:
    """Re-run this script in a venv where numpy 1.x (the pack's) shadows this Python's numpy 2.

    Triton 2.51's python stub is built against numpy 1 and misreads tensors under numpy 2. The stub ignores
    PYTHONPATH: it finds its packages through the venv of the first `python3` on PATH, which
    deploy.local.triton_server sets to this interpreter's. So this interpreter must be one whose site-packages
    hold numpy 1 first; a .pth file adds the original environment (torch, transformers) behind it.
    """
    import numpy

    if numpy.__version__ < "2" or os.environ.get("GPU_CHECK_NUMPY1") or not (pack / "numpy_stub.tar.xz").exists():
        return
    venv = UNPACK / "numpy1_venv"
    if not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
        with tarfile.open(pack / "numpy_stub.tar.xz") as tar:
            tar.extractall(purelib, filter="tar")
        here = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (purelib / "zz_original_env.pth").write_text("\n".join(here) + "\n")
        # scipy (and sklearn over it) built for numpy 2 fail to import under numpy 1, and transformers imports
        # sklearn whenever it is installed: hidden here, so transformers sees them as absent.
        (purelib / "hide_numpy2_only.pth").write_text("import sys; sys.modules.update(scipy=None, sklearn=None)\n")
    print(f"numpy {numpy.__version__} here: re-running under {venv} (numpy 1.x for Triton 2.51's stub)", flush=True)
    os.environ["GPU_CHECK_NUMPY1"] = "1"
    os.execv(str(venv / "bin" / "python"), [str(venv / "bin" / "python"), *sys.argv])

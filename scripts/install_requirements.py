"""Install requirements.txt into the project's venv with uv, under the package indexes pip is configured with.

pip took ~3 min of the 2-core host's time for the pinned set (unpacking ~2.6 GB serially, then compiling every
module's bytecode in one process); uv installs the same pins in ~10–50 s (its cache warm or cold), without
compiling (the Makefile lets each process write the bytecode of what it imports). uv reads neither
pip.conf nor PIP_* variables, so this reads pip's own effective configuration (`pip config list`: files and
environment) and hands the index settings to uv as arguments. Both indexes are searched for every package, as
pip does (`--index-strategy unsafe-best-match`): pip has no notion of a first index winning.

Usage: python scripts/install_requirements.py VENV_PYTHON REQUIREMENTS [--no-deps]
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

# pip option → uv flag; each value may list several entries separated by whitespace (pip's own convention).
_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# Later sections override earlier ones, as in pip: a file's [global], then its [install], then PIP_* variables.
_SECTION_ORDER = ("global", "install", ":env:")


def pip_settings(pip: str) -> dict[str, str]:
    """pip's effective value of each option, from `pip config list`."""
    return settings_from_listing(
        subprocess.run([pip, "config", "list"], check=True, capture_output=True, text=True).stdout
    )


def settings_from_listing(listed: str) -> dict[str, str]:
    """`pip config list` lines (`global.find-links='/opt/x'`, `:env:.find-links='/opt/y'`) → option → value."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, option = key.rpartition(".")
        if not sep or not dot or section not in _SECTION_ORDER:
            continue
        rank = _SECTION_ORDER.index(section)
        if option not in ranked or rank >= ranked[option][0]:
            ranked[option] = (rank, ast.literal_eval(raw))
    return {option: value for option, (_rank, value) in ranked.items()}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for option, flag in _FLAGS.items():
        for entry in settings.get(option, "").split():
            args += [flag, entry]
    return args


def main() -> int:
    python, requirements = sys.argv[1], sys.argv[2]
    no_deps = sys.argv[3:] == ["--no-deps"]
    bindir = Path(python).parent
    settings = pip_settings(str(bindir / "pip"))
    env = dict(os.environ)
    if "cert" in settings:
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    if "default-timeout" in settings:
        env.setdefault("UV_HTTP_TIMEOUT", settings["default-timeout"])
    # No --compile-bytecode: compiling all ~22,900 modules of the pinned set took 36 s of a warm-cache install's
    # 40 (57 CPU-s), and the suite, the demo and the builds import a fraction of them; the Makefile lets every
    # process write the bytecode of what it imports (PYTHONDONTWRITEBYTECODE empty), once.
    command = [str(bindir / "uv"), "pip", "install", "--quiet", "--python", python]
    command += [*uv_arguments(settings), "-r", requirements, *(["--no-deps"] if no_deps else [])]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())

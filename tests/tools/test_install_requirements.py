"""scripts/install_requirements.py: pip's index settings, handed to uv as pip would apply them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "install_requirements.py"
_spec = importlib.util.spec_from_file_location("install_requirements", _PATH)
assert _spec and _spec.loader
install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install)

# What `pip config list` printed on this machine (files and PIP_* variables), plus an [install] section.
LISTED = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/elsewhere'
install.find-links='/opt/install-only'
"""


def test_variables_override_install_which_overrides_global():
    settings = install.settings_from_listing(LISTED)
    assert settings["find-links"] == "/opt/wheels"
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert settings["constraint"] == "/etc/xdg/pip/constraints.txt"


def test_every_index_constraint_and_link_reaches_uv_and_both_indexes_are_searched():
    args = install.uv_arguments(install.settings_from_listing(LISTED))
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    pairs = list(zip(args[2::2], args[3::2], strict=True))
    assert pairs == [
        ("--extra-index-url", "file:///opt/pypi/simple"),
        ("--extra-index-url", "file:///opt/pypi-more/simple"),
        ("--find-links", "/opt/wheels"),
        ("--constraint", "/etc/xdg/pip/constraints.txt"),
    ]


def test_nothing_configured_is_plain_pypi():
    assert install.uv_arguments(install.settings_from_listing("")) == ["--index-strategy", "unsafe-best-match"]

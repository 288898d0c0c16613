"""Where the service keeps its files: the checkout (BASE_DIR) and the state directory (VAR_DIR: the embedded
database, broker, storage, the generated secret key), which every other part builds on."""

from __future__ import annotations

from pathlib import Path

from controlplane.core.env import env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(
    env_str(
        "CONTROLPLANE_VAR_DIR",
        str(BASE_DIR / "var"),
        help="The state directory: embedded database, broker, local storage, generated signing key.",
    )
)

"""The shipped deployments are secure by default: `manage.py check --deploy` prints no warning with the
environment that compose (its .env.example filled with secrets) and each Kubernetes overlay give the web
process: HSTS, the HTTPS redirect and secure cookies are set there, not left to the operator."""

from __future__ import annotations

import base64
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY, OVERLAYS, REPO, compose_file, render

_COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def _secret() -> str:
    return secrets.token_urlsafe(50)


def _env_example() -> dict[str, str]:
    """deploy/compose/.env.example as an operator fills it in: every empty value is a secret to generate."""
    values = {}
    for line in (DEPLOY / "compose" / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip() or _secret()
    return values


def _interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?error} (an empty value counts as unset for both)."""

    def replace(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if variables.get(name):
            return variables[name]
        assert kind != "?", f"{name} is required: {rest}"
        return rest if kind == "-" else ""

    return _COMPOSE_VARIABLE.sub(replace, value)


def compose_web_env() -> dict[str, str]:
    variables = _env_example()
    environment = compose_file()["services"]["web"]["environment"]
    return {name: _interpolate(str(value), variables) for name, value in environment.items()}


def k8s_web_env(overlay: str) -> dict[str, str]:
    """The web container's environment: its ConfigMap and Secret (a generated key where the overlay expects
    the cluster's secret store to provide it), then its own `env`, with $(VAR) expanded as the kubelet does."""
    docs = render(overlay)
    (web,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "controlplane-web"]
    (container,) = [c for c in web["spec"]["template"]["spec"]["containers"] if c["name"] == "web"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            (config,) = [
                d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == source["configMapRef"]["name"]
            ]
            env.update(config["data"])
        else:
            name = source["secretRef"]["name"]
            found = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
            data = {k: base64.b64decode(v).decode() for k, v in found[0]["data"].items()} if found else {}
            env.update({"DJANGO_SECRET_KEY": _secret(), **data})
    for entry in container.get("env", []):
        value = entry.get("value", "10.1.2.3")  # valueFrom: the pod's IP
        env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)
    return env


def _check_deploy(env: dict[str, str], var_dir: Path) -> subprocess.CompletedProcess[str]:
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    child = {**base, **env, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "CONTROLPLANE_VAR_DIR": str(var_dir)}
    if "PROMETHEUS_MULTIPROC_DIR" in child:  # a tmpfs in the container, created empty at its start
        child["PROMETHEUS_MULTIPROC_DIR"] = str(var_dir / "prometheus")
        (var_dir / "prometheus").mkdir()
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("deployment", ["compose", *OVERLAYS])
def test_check_deploy_is_clean_for_the_shipped_settings(deployment, tmp_path):
    env = compose_web_env() if deployment == "compose" else k8s_web_env(deployment)
    for name in ("SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        assert env.get(name) not in (None, "", "0", "false"), (deployment, name)
    done = _check_deploy(env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr

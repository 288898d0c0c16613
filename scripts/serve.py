"""`make serve`: Triton, web (127.0.0.1:8000), worker and beat in the foreground; Ctrl-C stops all.
Uses DATABASE_URL / CELERY_BROKER_URL when set, the embedded defaults otherwise."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from deploy.local.stack import Stack  # noqa: E402


def main() -> int:
    port = int(os.environ.get("PORT", "8000"))
    stack = Stack(var_dir=Path(os.environ.get("CONTROLPLANE_VAR_DIR", REPO_ROOT / "var")), web_port=port)
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with stack:
        print(
            f"serving on {stack.base_url}/v1 (admin: {stack.base_url}/admin/, fleet: "
            f"{stack.base_url}/admin/fleet/tritonserver/overview/); Triton gRPC {stack.triton_grpc_url} is "
            f"managed server {stack.triton_server_name!r} with {', '.join(stack.warm_models)} loaded; "
            f"logs in {stack.log_dir}. Ctrl-C stops everything.",
            flush=True,
        )
        print("create a tenant: .venv/bin/python manage.py tenant_create NAME", flush=True)
        while not stopping:
            for name, proc in list(stack.procs.items()):
                if proc.poll() is not None:
                    print(f"{name} exited with {proc.returncode}; stopping", flush=True)
                    stopping = True
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
